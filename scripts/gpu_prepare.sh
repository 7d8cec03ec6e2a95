#!/usr/bin/env bash
# Prepares a device run on a machine without a GPU: release builds of `ferrocomm` and the check
# programs into .carry/bin, every kernel compiled for the device's architecture into .carry/kc
# (so the device does not spend ~45 s compiling), and the Python wheel into dist/. Then:
#   device run, carry [".carry", "dist"]:  bash scripts/gpu_session.sh .carry/bin .carry/kc [PARTS]
#
#   scripts/gpu_prepare.sh [ARCH]      (default sm_90: H100/H200)
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-sm_90}"
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ]; then
  # The NVRTC wheel scripts/test.sh installs.
  lib="$(python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))' 2>/dev/null || true)"
  [ -n "$lib" ] && export FERROCOMM_NVRTC_LIB="$lib"
fi
cargo build --release -p ferrocomm-cli
cargo build --release -p ferrocomm --examples
mkdir -p .carry/bin
cp target/release/ferrocomm target/release/examples/gpu_check target/release/examples/gpu_check_coll \
  target/release/examples/gpu_check_lowp .carry/bin/
rm -rf .carry/kc
target/release/ferrocomm precompile --arch "$arch" --cache .carry/kc
rm -rf dist
python3 -m pip wheel --no-deps . -w dist/
du -sh .carry dist

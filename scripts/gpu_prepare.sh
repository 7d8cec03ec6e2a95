#!/usr/bin/env bash
# Prepares a device run on a machine without a GPU: release builds of `ferrocomm` and the check
# programs, every kernel compiled for the device's architecture into .carry/kc (so the device does
# not spend ~45 s compiling), and the Python wheel into dist/.
#
#   scripts/gpu_prepare.sh [ARCH]                 (default sm_90: H100/H200)
#     binaries into .carry/bin, a fresh .carry/kc, the wheel; then, carry [".carry", "dist"]:
#     bash scripts/gpu_session.sh .carry/bin .carry/kc [PARTS]
#   scripts/gpu_prepare.sh --variant NAME [ARCH]
#     the working tree as variant NAME for an A/B: binaries into .carry/bin-NAME, its kernels
#     added to .carry/kc beside the other variants' (the cache key is the source hash), no wheel.
#     Build A, edit, build B, then carry [".carry"]:
#     bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B
#     Mind the carry limit (64 MiB): a variant adds ~8 MiB of binaries and up to ~12 MiB of
#     kernels (the modules whose source changed).
set -euo pipefail
cd "$(dirname "$0")/.."
variant=""
if [ "${1:-}" = --variant ]; then
  variant="$2"
  shift 2
fi
arch="${1:-sm_90}"
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ]; then
  # The NVRTC wheel scripts/test.sh installs.
  lib="$(python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))' 2>/dev/null || true)"
  [ -n "$lib" ] && export FERROCOMM_NVRTC_LIB="$lib"
fi
# Two commands: with --examples cargo builds no bin target, so one command would leave a stale CLI.
cargo build --release -p ferrocomm-cli
cargo build --release -p ferrocomm --examples
out=".carry/bin${variant:+-$variant}"
rm -rf "$out"
mkdir -p "$out"
cp target/release/ferrocomm target/release/examples/gpu_check target/release/examples/gpu_check_coll \
  target/release/examples/gpu_check_lowp "$out/"
[ -n "$variant" ] || rm -rf .carry/kc
"$out/ferrocomm" precompile --arch "$arch" --cache .carry/kc
if [ -z "$variant" ]; then
  rm -rf dist
  python3 -m pip wheel --no-deps . -w dist/
  du -sh .carry dist
else
  du -sh .carry "$out" .carry/kc
fi

#!/usr/bin/env bash
# Builds the working tree as a named variant for a device A/B (scripts/gpu_ab.sh): release
# builds of ferrocomm and the check programs into .carry/bin-NAME, and its kernels compiled for
# the device's architecture into .carry/kc beside those already there (the cache key is the
# source hash, so variants do not collide). Build A, edit, build B, then one device call:
#   carry [".carry"]:  bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B
# Mind the carry limit (64 MiB): each variant adds ~8 MiB of binaries and up to ~12 MiB of
# kernels (only modules whose source changed).
#
#   scripts/gpu_variant.sh NAME [ARCH]      (default sm_90: H100/H200)
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1"
arch="${2:-sm_90}"
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ]; then
  lib="$(python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))' 2>/dev/null || true)"
  [ -n "$lib" ] && export FERROCOMM_NVRTC_LIB="$lib"
fi
# The CLI and the examples are separate cargo targets: build both (--examples alone skips the bin).
cargo build --release -p ferrocomm-cli
cargo build --release -p ferrocomm --examples
out=".carry/bin-$name"
rm -rf "$out"
mkdir -p "$out" .carry/kc
cp target/release/ferrocomm target/release/examples/gpu_check_coll \
  target/release/examples/gpu_check_lowp "$out/"
"$out/ferrocomm" precompile --arch "$arch" --cache .carry/kc
du -sh .carry "$out" .carry/kc

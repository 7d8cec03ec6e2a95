#!/usr/bin/env bash
# Builds everything a GPU machine needs, on a machine with Rust (no GPU needed): release builds of
# `ferrocomm` and the check programs and the Python wheel, all with the CUDA kernels built in
# (sm_80, sm_90, sm_100 cubins, sm_90 PTX; NVRTC from .venv, which scripts/test.sh makes), and
# a kernel cache for ARCH when it is not built in. The GPU machine then needs no Rust, no
# network and no compile: copy BUILD_DIR and this checkout there.
#
#   scripts/gpu_prepare.sh BUILD_DIR [ARCH]        (ARCH defaults to sm_90: H100/H200)
#     BUILD_DIR/bin: ferrocomm, gpu_check, gpu_check_coll, gpu_check_lowp, gpu_check_norm,
#     gpu_check_nccl, gpu_peer_death;
#     BUILD_DIR/kc: a fresh kernel cache (empty when ARCH is built in); BUILD_DIR/dist: the
#     wheel. Then, on the GPU machine:
#     scripts/gpu_session.sh BUILD_DIR OUT_DIR [PARTS]   (or gpu_check.sh, gpu_sanitize.sh, ...)
#   FERROCOMM_BUILD_ARCHS=sm_90 limits the built-in kernels to H100/H200's (a build whose kernel
#   sources changed then compiles those alone).
#   scripts/gpu_prepare.sh BUILD_DIR --variant NAME [ARCH]
#     the working tree as variant NAME for an A/B: binaries into BUILD_DIR/bin-NAME, its kernels
#     added to BUILD_DIR/kc beside the other variants' (the cache key is the source hash), its
#     wheel into BUILD_DIR/dist-NAME. Build A, edit, build B, then on the GPU machine:
#     scripts/gpu_ab.sh OUT_DIR BUILD_DIR/kc BUILD_DIR/bin-A BUILD_DIR/bin-B
#     python3 scripts/norm_bench.py OUT_DIR --variant A=BUILD_DIR/dist-A --variant B=BUILD_DIR/dist-B
#     A variant adds ~8 MiB of binaries, a wheel of ~8 MB and up to ~12 MiB of kernels (the
#     modules whose source changed).
#   scripts/gpu_prepare.sh BUILD_DIR --variant NAME --from COMMIT [--patches 'FILE...'] [ARCH]
#     the same for another commit (the patches applied on it with `git am -3`), built in a
#     temporary worktree into target/variants of this checkout.
set -euo pipefail
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || {
  echo "usage: scripts/gpu_prepare.sh BUILD_DIR [--variant NAME [--from COMMIT [--patches 'FILE...']]] [ARCH]" >&2
  exit 2
}
mkdir -p "$1"
build="$(cd "$1" && pwd)"
shift
cd "$(dirname "$0")/.."
variant="" from="" patches=""
if [ "${1:-}" = --variant ]; then
  variant="$2"
  shift 2
fi
if [ "${1:-}" = --from ]; then
  from="$2"
  shift 2
fi
if [ "${1:-}" = --patches ]; then
  patches="$2"
  shift 2
fi
arch="${1:-sm_90}"
[ -z "$from" ] || [ -n "$variant" ] || { echo "--from needs --variant NAME" >&2; exit 2; }
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ]; then
  # The NVRTC wheel scripts/test.sh installs into .venv (or one the python3 on PATH has): the
  # builds below compile the kernels built into the binaries and the wheel with it.
  for py in .venv/bin/python python3; do
    lib="$("$py" -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))' 2>/dev/null || true)"
    if [ -n "$lib" ]; then
      export FERROCOMM_NVRTC_LIB="$(realpath "$lib")"
      break
    fi
  done
fi
echo "NVRTC for the built-in kernels: ${FERROCOMM_NVRTC_LIB:-none found (the kernels compile at first use on the GPU)}"
target="$PWD/target"
src="$PWD"
if [ -n "$from" ]; then
  # A target directory of their own: cargo names a workspace member's artifacts the same in
  # every checkout, so a build of this checkout running meanwhile (tests, the wheel) would
  # replace the variant's library under it.
  target="$PWD/target/variants"
  src="$(mktemp -d /tmp/fc-variant-XXXXXX)"
  git worktree add --detach "$src" "$from" > /dev/null
  trap 'git worktree remove --force "$src"' EXIT
  if [ -n "$patches" ]; then
    abs=()
    for f in $patches; do abs+=("$(realpath "$f")"); done
    git -C "$src" am -3 --quiet "${abs[@]}"
  fi
fi
# The kernel sources are embedded in the binaries: with one target directory for several
# checkouts, cargo must see them changed to build each one's.
touch "$src"/crates/ferrocomm/kernels/*.cu
# Two commands: with --examples cargo builds no bin target, so one command would leave a stale CLI.
(cd "$src" && CARGO_TARGET_DIR="$target" cargo build --release -p ferrocomm-cli)
(cd "$src" && CARGO_TARGET_DIR="$target" cargo build --release -p ferrocomm --examples)
[ -z "$from" ] || touch crates/ferrocomm/kernels/*.cu
out="$build/bin${variant:+-$variant}"
rm -rf "$out"
mkdir -p "$out"
cp "$target"/release/ferrocomm "$target"/release/examples/gpu_check \
  "$target"/release/examples/gpu_check_coll "$target"/release/examples/gpu_check_lowp \
  "$target"/release/examples/gpu_check_norm "$target"/release/examples/gpu_check_nccl \
  "$target"/release/examples/gpu_peer_death "$out/"
[ -n "$variant" ] || rm -rf "$build/kc"
"$out/ferrocomm" precompile --arch "$arch" --cache "$build/kc"
# Where every unit is built in, precompile writes nothing; the GPU scripts point the library's
# cache here all the same.
mkdir -p "$build/kc"
# Symbols are of no use on the GPU machine: smaller copies.
strip "$out"/*
if [ -z "$variant" ]; then
  rm -rf "$build/dist"
  python3 -m pip wheel --no-deps . -w "$build/dist"
  # The kernels the binaries and the wheel carry, as the GPU will find them.
  "$out/ferrocomm" info --arch "$arch" | sed -n '/^== Kernels/,/^$/p'
else
  # The variant's wheel (scripts/norm_bench.py --variant NAME=BUILD_DIR/dist-NAME), built in
  # the variant's checkout and target directory like its binaries.
  rm -rf "$build/dist-$variant"
  (cd "$src" && CARGO_TARGET_DIR="$target" python3 -m pip wheel --no-deps . -w "$build/dist-$variant")
fi
du -sh "$build" "$out" "$build/kc"

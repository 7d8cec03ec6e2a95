#!/usr/bin/env bash
# The fused all-reduce + residual add + RMSNorm device check
# (crates/ferrocomm/examples/gpu_check_norm.rs) at 2 and 3 ranks, through `ferrocomm launch`.
#
#   scripts/gpu_check_norm.sh BUILD_DIR OUT_DIR [gpu_check_norm flags...]
#
# BUILD_DIR is what scripts/gpu_prepare.sh made (bin/ferrocomm, bin/gpu_check_norm, the kernel
# cache kc/, the wheel dist/); the logs go to OUT_DIR/gpu_check_norm-<ranks>.log and, with the
# wheel, OUT_DIR/check_rmsnorm-<ranks>.log (python/tests/gpu/check_rmsnorm.py, torch tensors).
# With fewer GPUs than ranks the ranks share them (--share-gpus: NCCL left out, as NCCL refuses
# two ranks on one GPU). Flags go to gpu_check_norm (--quick). Exits non-zero when a run fails.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/gpu_check_norm.sh BUILD_DIR OUT_DIR [flags...]" >&2; exit 2; }
build="$(cd "$1" && pwd)" || exit 2
mkdir -p "$2" && out="$(cd "$2" && pwd)" || exit 2
shift 2
bin="$build/bin"
[ -x "$bin/ferrocomm" ] && [ -x "$bin/gpu_check_norm" ] || {
  echo "gpu_check_norm.sh: $bin must hold ferrocomm and gpu_check_norm (scripts/gpu_prepare.sh BUILD_DIR)" >&2
  exit 2
}
export NCCL_NVLS_ENABLE=0
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-30}"
[ -d "$build/kc" ] && export FERROCOMM_KERNEL_CACHE="${FERROCOMM_KERNEL_CACHE:-$build/kc}"
nvidia-smi -L | tee "$out/gpu_check_norm-machine.txt" || true
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
status=0
for n in 2 3; do
  share=()
  [ "$ngpu" -ge "$n" ] || share=(--share-gpus)
  "$bin/ferrocomm" launch -n "$n" --timeout 560 -- "$bin/gpu_check_norm" "${share[@]}" "$@" \
    2>&1 | tee "$out/gpu_check_norm-$n.log" || status=1
done
# The Python API on CUDA tensors (torch), from the wheel gpu_prepare.sh built.
if ls "$build"/dist/ferrocomm-*.whl > /dev/null 2>&1; then
  site="$(mktemp -d /tmp/ferrocomm-site-XXXXXX)"
  trap 'rm -rf "$site"' EXIT
  python3 -m pip install -q --no-deps --no-index --target "$site" "$build"/dist/ferrocomm-*.whl
  here="$(cd "$(dirname "$0")/.." && pwd)"
  for n in 2 3; do
    share=()
    [ "$ngpu" -ge "$n" ] || share=(--share-gpus)
    PYTHONPATH="$site:$here/python/tests/gpu" "$bin/ferrocomm" launch -n "$n" --timeout 300 -- \
      python3 "$here/python/tests/gpu/check_rmsnorm.py" "${share[@]}" \
      2>&1 | tee "$out/check_rmsnorm-$n.log" || status=1
  done
fi
exit $status

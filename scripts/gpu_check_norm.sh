#!/usr/bin/env bash
# The fused all-reduce + residual add + RMSNorm device check
# (crates/ferrocomm/examples/gpu_check_norm.rs) at 1, 2 and 3 ranks, through `ferrocomm launch`.
#
#   scripts/gpu_check_norm.sh BUILD_DIR OUT_DIR [--variant NAME] [gpu_check_norm flags...]
#
# BUILD_DIR is what scripts/gpu_prepare.sh made (bin/ferrocomm, bin/gpu_check_norm, the kernel
# cache kc/, the wheel dist/; with --variant NAME, gpu_prepare.sh --variant NAME's bin-NAME/ and
# dist-NAME/ instead). The Rust check runs three times at each size: two launches
# (FERROCOMM_RMSNORM_FUSED=0), one launch (=1: flat and tree calls take the one-shot and the
# two-shot kernel, auto the one-shot), and one launch with FERROCOMM_RMSNORM_FLAT_MAX_BYTES=65536
# (auto takes the two-shot above 64 KiB); logs OUT_DIR/gpu_check_norm-<mode>-<ranks>.log. With
# the wheel, OUT_DIR/check_rmsnorm-<mode>-<ranks>.log (python/tests/gpu/check_rmsnorm.py, torch
# tensors) with two and with one launch.
# With fewer GPUs than ranks the ranks share them (--share-gpus: NCCL left out, as NCCL refuses
# two ranks on one GPU). Flags go to gpu_check_norm (--quick). Exits non-zero when a run fails.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs out "usage: scripts/gpu_check_norm.sh BUILD_DIR OUT_DIR [flags...]" "$@" || exit 2
shift 2
variant=""
if [ "${1:-}" = --variant ]; then
  variant="-${2:?--variant needs a NAME}"
  shift 2
fi
bin="$build/bin$variant"
dist="$build/dist$variant"
gpu_need_bins gpu_check_norm.sh "scripts/gpu_prepare.sh BUILD_DIR${variant:+ --variant ${variant#-}}" \
  ferrocomm gpu_check_norm || exit 2
gpu_env
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-30}"
gpu_machine gpu_check_norm
status=0
# mode name, FERROCOMM_RMSNORM_FUSED, FERROCOMM_RMSNORM_FLAT_MAX_BYTES (-: the default)
for m in "two-launch 0 -" "fused 1 -" "fused-tree 1 65536"; do
  read -r name fused flat <<< "$m"
  flat="${flat#-}"
  # One rank: the local form (the norm kernel on x itself) with one launch on, the two
  # launches' (an all-reduce of one rank, then the norm) with it off.
  ranks="2 3"
  [ "$name" = fused-tree ] || ranks="1 2 3"
  for n in $ranks; do
    share=()
    [ "$ngpu" -ge "$n" ] || share=(--share-gpus)
    FERROCOMM_RMSNORM_FUSED="$fused" FERROCOMM_RMSNORM_FLAT_MAX_BYTES="$flat" \
      "$bin/ferrocomm" launch -n "$n" --timeout 560 -- "$bin/gpu_check_norm" "${share[@]}" "$@" \
      2>&1 | tee "$out/gpu_check_norm-$name-$n.log" || status=1
  done
done
# The Python API on CUDA tensors (torch), from the wheel gpu_prepare.sh built.
if ls "$dist"/ferrocomm-*.whl > /dev/null 2>&1; then
  site="$(mktemp -d /tmp/ferrocomm-site-XXXXXX)"
  trap 'rm -rf "$site"' EXIT
  python3 -m pip install -q --no-deps --no-index --target "$site" "$dist"/ferrocomm-*.whl
  here="$(cd "$(dirname "$0")/.." && pwd)"
  for fused in 0 1; do
    for n in 2 3; do
      share=()
      [ "$ngpu" -ge "$n" ] || share=(--share-gpus)
      FERROCOMM_RMSNORM_FUSED="$fused" PYTHONPATH="$site:$here/python/tests/gpu" \
        "$bin/ferrocomm" launch -n "$n" --timeout 300 -- \
        python3 "$here/python/tests/gpu/check_rmsnorm.py" "${share[@]}" \
        2>&1 | tee "$out/check_rmsnorm-fused$fused-$n.log" || status=1
    done
  done
fi
exit $status

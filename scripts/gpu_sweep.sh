#!/usr/bin/env bash
# The benchmark sweep of a GPU machine: correctness first (gpu_check on every GPU), then
# `ferrocomm bench --vs nccl` for every collective in eager and CUDA-graph mode, full and low
# precision, with JSON and PNG for each, into OUT_DIR (OUT_DIR/summary.txt: one line a step).
#
#   scripts/gpu_sweep.sh BUILD_DIR OUT_DIR [NGPUS] [MAXBYTES]
#
# BUILD_DIR is what scripts/gpu_prepare.sh made (bin/ferrocomm, bin/gpu_check, the kernel cache
# kc/). NGPUS defaults to every GPU of the machine, MAXBYTES to 1G. NVLink multicast stays off.
# SWEEP_STEP_S (60) limits each step, SWEEP_CHECK_S (240) the gpu_check step, SWEEP_ITERS /
# SWEEP_REPS (10 / 3) set -n / --reps.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs res "usage: scripts/gpu_sweep.sh BUILD_DIR OUT_DIR [NGPUS] [MAXBYTES]" "$@" || exit 2
n="${3:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
max="${4:-1G}"
bin="$build/bin"
gpu_check="$bin/gpu_check"
[ -x "$bin/ferrocomm" ] || { echo "gpu_sweep.sh: no ferrocomm in $bin (scripts/gpu_prepare.sh BUILD_DIR)" >&2; exit 2; }
gpu_env
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-60}"
fc="$bin/ferrocomm"
iters="${SWEEP_ITERS:-10}"
reps="${SWEEP_REPS:-3}"
step_s="${SWEEP_STEP_S:-60}"   # limit of one step: a stuck bench cannot hold the sweep

summary="$res/summary.txt"
{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$res/machine.txt" 2>&1
"$fc" info > "$res/info.txt" 2>&1

step() { # name, command... (STEP_LIMIT_S overrides the step's limit)
  local name="$1"; shift
  local t0=$SECONDS
  timeout "${STEP_LIMIT_S:-$step_s}" "$@" > "$res/$name.txt" 2>&1
  local rc=$?
  printf '%-40s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E 'Out of bounds|Avg bus|all results' "$res/$name.txt" | tr '\n' ' ')" | tee -a "$summary"
}

if [ -x "$gpu_check" ]; then
  # At 4 ranks the quick matrix alone took 48 s (bench/results/2026-11-30-h200x4-first).
  STEP_LIMIT_S="${SWEEP_CHECK_S:-240}" step gpu_check "$fc" launch -n "$n" --timeout 400 -- \
    "$gpu_check" --quick --no-timing
fi

for coll in all_reduce all_gather reduce_scatter all_to_all broadcast reduce sendrecv; do
  case "$coll" in
    all_reduce|broadcast|reduce|sendrecv) min=8 ;;
    *) min=$((2 * n * 64)) ;;   # whole bf16 elements per rank
  esac
  for mode in graph eager; do
    g=0; [ "$mode" = graph ] && g=10
    step "$coll-bf16-$mode" "$fc" bench "$coll" -g "$n" -d bfloat16 -b "$min" -e "$max" -f 4 \
      -n "$iters" --reps "$reps" -G "$g" --vs nccl \
      --json "$res/$coll-bf16-$mode.json" --plot "$res/$coll-bf16-$mode.png"
  done
done
step all_reduce-bf16-isolated "$fc" bench all_reduce -g "$n" -d bfloat16 -b 1K -e 64M -f 8 \
  -n "$iters" --reps "$reps" --isolated --vs nccl --json "$res/all_reduce-bf16-isolated.json"
for lp in e4m3 int8; do
  for coll in all_reduce all_gather reduce_scatter all_to_all; do
    step "$coll-bf16-lp-$lp" "$fc" bench "$coll" -g "$n" -d bfloat16 -b 64K -e "$max" -f 4 \
      -n "$iters" --reps "$reps" -G 10 --low-precision "$lp" --vs nccl \
      --json "$res/$coll-bf16-lp-$lp.json" --plot "$res/$coll-bf16-lp-$lp.png"
  done
done
step all_reduce-f32-lp-e4m3 "$fc" bench all_reduce -g "$n" -d float -b 64K -e "$max" -f 4 \
  -n "$iters" --reps "$reps" -G 10 --low-precision e4m3 --vs nccl \
  --json "$res/all_reduce-f32-lp-e4m3.json" --plot "$res/all_reduce-f32-lp-e4m3.png"

cat "$summary"

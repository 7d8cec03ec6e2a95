#!/usr/bin/env bash
# A/B of two builds in one device run (same machine, same minute): the low-precision check of
# build B, then each bench in BENCHES run with A and with B alternately. Both builds' kernels must
# be in the one kernel cache (`ferrocomm precompile --cache KC` from each build; the key is the
# source hash). Results and a summary in $OUT/ab/.
#   bash scripts/gpu_ab.sh BIN_A BIN_B KC ["all_reduce bfloat16" ...]
# BIN_B needs ferrocomm and gpu_check_lowp; BIN_A needs ferrocomm.
set -uo pipefail
a="$(cd "$1" && pwd)"; b="$(cd "$2" && pwd)"
export FERROCOMM_KERNEL_CACHE="$(cd "$3" && pwd)"
shift 3
[ $# -gt 0 ] || set -- "all_reduce bfloat16" "all_reduce float" "all_gather bfloat16" "all_to_all bfloat16"
export NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=30
res="${OUT:-/tmp}/ab"
mkdir -p "$res"
timeout 100 "$b/ferrocomm" launch -n 2 --timeout 98 -- "$b/gpu_check_lowp" > "$res/lowp-check-B.txt" 2>&1
echo "gpu_check_lowp (B): exit $? $(grep -E 'passed' "$res/lowp-check-B.txt" | tail -1)" | tee "$res/summary.txt"
for c in "$@"; do
  set -- $c
  for side in A B; do
    bin=$a; [ $side = B ] && bin=$b
    f="$res/lp-$1-$2-$side"
    timeout 40 "$bin/ferrocomm" bench "$1" -g 2 -d "$2" -b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 \
      --low-precision e4m3 --vs nccl --json "$f.json" > "$f.txt" 2>&1
    echo "== $1 $2 $side (exit $?)" >> "$res/summary.txt"
    grep -E '^ +[0-9]' "$f.txt" >> "$res/summary.txt"
  done
done
cat "$res/summary.txt"

#!/usr/bin/env bash
# Call 4: E (all-to-all own part copied before the barrier) checked and A/B against M (main
# 78927c7); then the low-precision table of the current kernels (E's build; the change touches
# only the all-to-all(-v) path).
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
B=$PWD/.carry/bin-E; F=$B/ferrocomm
AB_CHECK=gpu_check_lowp AB_STEP_S=45 AB_BENCHES="all_to_all bfloat16;all_to_all_v bfloat16" \
  AB_ARGS="-b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" OUT=$R \
  timeout 250 bash scripts/gpu_ab.sh .carry/kc .carry/bin-M .carry/bin-E 2>&1 | grep -E "^==|^gpu_check|^ +[0-9]" | awk '{print $1,$2,$3,$4,$6,$10,$15,$16,$17,$18}'
run() { local name=$1; local lim=$2; shift 2; t=$(date +%s); FERROCOMM_TIMEOUT_S=10 timeout $lim $F bench "$@" -g 2 --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?, $(( $(date +%s)-t ))s)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $14, $15, $16, $17, $18}'; }
for c in "all_reduce bfloat16" "all_reduce float" "all_gather bfloat16" "reduce_scatter bfloat16"; do
  set -- $c
  run lp-$1-$2 60 $1 -d $2 -b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
done
t=$(date +%s)
OUT=$R SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 bash scripts/gpu_sanitize.sh $B 2>&1 | tail -3; echo "sanitize $(( $(date +%s)-t ))s"
grep -hE "ERROR SUMMARY|passed|failed" $R/sanitize-*.log | tail -6
cd $OUT && tar czf r.tgz r && rm -rf r

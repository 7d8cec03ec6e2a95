#!/usr/bin/env bash
# Call 10: P (main + low-precision all-to-all-v in place) checked and sanitized; R (main + the
# plain one-shot kernel in two rounds from 4 MiB parts) checked, A/B against P, sanitized.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
P=$PWD/.carry/bin-P
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 150 $P/ferrocomm launch -n 2 -- $P/gpu_check_lowp --no-timing > $R/check_lowp-P.txt 2>&1; echo "check_lowp P exit $? $(( $(date +%s)-t ))s"
grep -E "passed|failed|FAIL" $R/check_lowp-P.txt | tail -4
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 120 $P/ferrocomm launch -n 2 -- $P/gpu_check_coll > $R/check_coll-P.txt 2>&1; echo "check_coll P exit $? $(( $(date +%s)-t ))s"
grep -E "FAIL|correct|mismatch" $R/check_coll-P.txt | tail -6
mkdir -p $R/san-P $R/san-R
OUT=$R/san-P SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=120 bash scripts/gpu_sanitize.sh $P 2>&1 | tail -2
AB_CHECK=gpu_check_lowp AB_STEP_S=40 AB_BENCHES="all_reduce bfloat16;all_reduce float;all_gather bfloat16;all_to_all bfloat16" \
  AB_ARGS="-b 4M -e 16M -f 2 -n 10 --reps 3 -G 10 --low-precision e4m3 --vs nccl" OUT=$R \
  timeout 260 bash scripts/gpu_ab.sh .carry/kc .carry/bin-P .carry/bin-R 2>&1 | grep -E "^==|^gpu_check|^ +[0-9]" | awk '{print $1,$2,$3,$4,$6,$10,$14,$15,$16,$17,$18}'
OUT=$R/san-R SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 bash scripts/gpu_sanitize.sh .carry/bin-R 2>&1 | tail -2
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $R/san-*/sanitize-*.log | tail -12
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Call 5: P = main + the push's records sent by bulk copies (TMA) from two shared-memory buffers in
# turn. Checks and compute-sanitizer on P, then C (main ab84415) / P benches.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
P=$PWD/.carry/bin-P
FERROCOMM_TIMEOUT_S=10 timeout 110 $P/ferrocomm launch -n 2 --timeout 105 -- $P/gpu_check_lowp > $R/check-lowp-P.txt 2>&1; rc=$?
echo "check P exit $rc"; grep -E "quantize alone|passed" $R/check-lowp-P.txt | tail -2; grep -E "FAIL|rror" $R/check-lowp-P.txt | head -5
if [ $rc != 0 ]; then cd $OUT && tar czf r.tgz r; exit 1; fi
SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 OUT=$R bash scripts/gpu_sanitize.sh $P > $R/sanitize-P.txt 2>&1; echo "sanitize P exit $?"; tail -3 $R/sanitize-P.txt
AB_CHECK=none AB_STEP_S=30 AB_ARGS="-b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" OUT=$R bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-P > $R/ab.log 2>&1
echo "ab exit $?"; grep -E "^==|^ +[0-9]" $R/ab/summary.txt | awk '/^==/{print; next}{print $1, $6, $10, $15, $16}'
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Call 6: L (LL all-to-all-v at two ranks) checked, sanitized and A/B against G (main dd9adef).
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
AB_CHECK=gpu_check_coll AB_STEP_S=40 AB_BENCHES="all_to_all_v bfloat16;all_to_all_v float" \
  AB_ARGS="-b 1K -e 1M -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$R \
  timeout 200 bash scripts/gpu_ab.sh .carry/kc .carry/bin-G .carry/bin-L 2>&1 | grep -E "^==|^gpu_check|^ +[0-9]" | awk '{print $1,$2,$3,$4,$6,$10,$14,$15,$16}'
grep -E "mismatch|FAIL|all_to_all_v|correct" $R/ab/gpu_check_coll-bin-L.txt | tail -8
t=$(date +%s)
OUT=$R SANITIZE_PROGRAMS=gpu_check_coll SANITIZE_RUN_TIMEOUT_S=200 bash scripts/gpu_sanitize.sh .carry/bin-L 2>&1 | tail -3; echo "sanitize $(( $(date +%s)-t ))s"
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|correct|FAIL" $R/sanitize-*.log | tail -8
cd $OUT && tar czf r.tgz r && rm -rf r

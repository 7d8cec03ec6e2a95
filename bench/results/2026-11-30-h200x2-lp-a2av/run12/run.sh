#!/usr/bin/env bash
# Call 12: G2 (main + the low-precision all-gather pushes at every size, in more chunks than
# pull needs) checked and A/B against P (= main dcf2f51).
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
AB_CHECK=gpu_check_lowp AB_STEP_S=40 AB_BENCHES="all_gather bfloat16;all_gather float" \
  AB_ARGS="-b 16M -e 256M -f 4 -n 10 --reps 3 -G 10 --low-precision e4m3 --vs nccl" OUT=$R \
  timeout 230 bash scripts/gpu_ab.sh .carry/kc .carry/bin-P .carry/bin-G2 2>&1 | grep -E "^==|^gpu_check|^ +[0-9]" | awk '{print $1,$2,$3,$4,$6,$10,$14,$15,$16,$17,$18}'
grep -E "passed|failed" $R/ab/gpu_check_lowp-bin-G2.txt | tail -1
cd $OUT && tar czf r.tgz r && rm -rf r

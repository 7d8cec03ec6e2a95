#!/usr/bin/env bash
# Call 5: G (full-precision all-to-all-v grid from the piece's crossing size at two ranks)
# checked and A/B against E (main d531167).
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
AB_CHECK=gpu_check_coll AB_STEP_S=60 AB_BENCHES="all_to_all_v bfloat16;all_to_all_v float" \
  AB_ARGS="-b 1K -e 256M -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$R \
  timeout 400 bash scripts/gpu_ab.sh .carry/kc .carry/bin-E .carry/bin-G 2>&1 | grep -E "^==|^gpu_check|^ +[0-9]" | awk '{print $1,$2,$3,$4,$6,$10,$14,$15,$16}'
tail -14 $R/ab/gpu_check_coll-bin-G.txt
cd $OUT && tar czf r.tgz r && rm -rf r

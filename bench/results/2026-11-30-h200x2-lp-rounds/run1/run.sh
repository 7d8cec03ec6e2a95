#!/usr/bin/env bash
# LP in rounds: checks of B, then A/B benches.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=30
B=.carry/bin-B
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
timeout 100 $B/ferrocomm launch -n 2 --timeout 98 -- $B/gpu_check_lowp > $R/lowp-B.txt 2>&1; echo "lowp B exit $?" | tee -a $R/checks.txt
FC_TUNE_LP_PIPE_MIN=1 FC_TUNE_LP_ROUND=65536 timeout 100 $B/ferrocomm launch -n 2 --timeout 98 -- $B/gpu_check_lowp > $R/lowp-B-rounds.txt 2>&1; echo "lowp B rounds-everywhere exit $?" | tee -a $R/checks.txt
timeout 60 $B/ferrocomm launch -n 2 --timeout 58 -- $B/gpu_check_coll > $R/coll-B.txt 2>&1; echo "coll B exit $?" | tee -a $R/checks.txt
grep -E 'passed|failed|FAIL|wrong|quantize alone' $R/lowp-B*.txt | tail -8 >> $R/checks.txt
tail -3 $R/coll-B.txt >> $R/checks.txt
AB_CHECK=none AB_STEP_S=40 OUT=$R bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B .carry/bin-B@FC_TUNE_LP_ROUND=2097152 .carry/bin-B@FC_TUNE_LP_ROUND=8388608 > /dev/null 2>&1
cat $R/checks.txt
cat $R/ab/summary.txt
cd $OUT && tar czf r.tgz r && rm -rf r

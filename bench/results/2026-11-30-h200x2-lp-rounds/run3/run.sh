#!/usr/bin/env bash
# LP one-shot by warp roles (fc_lp_move_rw, a barrier per round): checks of B, then A/B benches.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=10
B=.carry/bin-B
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
FC_TUNE_LP_PIPE_MIN=1 FC_TUNE_LP_ROUND=65536 timeout 70 $B/ferrocomm launch -n 2 --timeout 65 -- $B/gpu_check_lowp > $R/lowp-B-rounds.txt 2>&1; x=$?; echo "lowp B rounds-everywhere exit $x" | tee -a $R/checks.txt
if [ $x != 0 ]; then tail -20 $R/lowp-B-rounds.txt; cd $OUT && tar czf r.tgz r && rm -rf r; exit 1; fi
timeout 70 $B/ferrocomm launch -n 2 --timeout 65 -- $B/gpu_check_lowp > $R/lowp-B.txt 2>&1; echo "lowp B exit $?" | tee -a $R/checks.txt
grep -E 'passed|failed|FAIL|wrong|quantize alone' $R/lowp-B*.txt | tail -8 >> $R/checks.txt
cat $R/checks.txt
AB_CHECK=none AB_STEP_S=30 OUT=$R bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B .carry/bin-B@FC_TUNE_LP_ROUND=1048576 .carry/bin-B@FC_TUNE_LP_QW=6 .carry/bin-B@FC_TUNE_LP_QW=10 > /dev/null 2>&1
grep -E "^==|^ +[0-9]+ " $R/ab/summary.txt | awk '/^==/{print; next}{print $1, $6, $10, $15, $16, $17}'
cd $OUT && tar czf r.tgz r && rm -rf r

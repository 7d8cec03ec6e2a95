#!/usr/bin/env bash
# Call 3: C = main ab84415; D = C + fc_lp_move quantizing two groups per step + the decode's next
# group loaded ahead (+ quantization alone timed on one wave, launches back to back);
# E = D with one group per step (the decode ahead only). Checks of D and E, sanitizer on D, benches.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
for v in D E; do
  B=$PWD/.carry/bin-$v
  FERROCOMM_TIMEOUT_S=10 timeout 110 $B/ferrocomm launch -n 2 --timeout 105 -- $B/gpu_check_lowp > $R/check-lowp-$v.txt 2>&1; rc=$?
  echo "check $v exit $rc"; grep -E "quantize alone|passed" $R/check-lowp-$v.txt | tail -2; grep -E "FAIL" $R/check-lowp-$v.txt | head -5
  if [ $rc != 0 ]; then cd $OUT && tar czf r.tgz r; exit 1; fi
done
SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 OUT=$R bash scripts/gpu_sanitize.sh .carry/bin-D > $R/sanitize-D.txt 2>&1; echo "sanitize D exit $?"; tail -3 $R/sanitize-D.txt
AB_CHECK=none AB_STEP_S=28 AB_ARGS="-b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" OUT=$R bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-D .carry/bin-E > $R/ab.log 2>&1
echo "ab exit $?"; grep -E "^==|^ +[0-9]" $R/ab/summary.txt | awk '/^==/{print; next}{print $1, $6, $10, $15, $16}'
cd $OUT && tar czf r.tgz r && rm -rf r

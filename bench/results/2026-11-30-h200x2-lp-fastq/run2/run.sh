#!/usr/bin/env bash
# Call 2: C = wip/lp-fastq (lp-sig + reciprocal quotient, shifts, paired FP8 decode): checks,
# quantization alone, compute-sanitizer; then A (main) / B (lp-sig) / C benches.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
C=$PWD/.carry/bin-C
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
FERROCOMM_TIMEOUT_S=10 timeout 110 $C/ferrocomm launch -n 2 --timeout 105 -- $C/gpu_check_lowp > $R/check-lowp-C.txt 2>&1; rc=$?
echo "check C exit $rc"; tail -3 $R/check-lowp-C.txt; grep -E "FAIL" $R/check-lowp-C.txt | head
if [ $rc != 0 ]; then cd $OUT && tar czf r.tgz r; exit 1; fi
SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 OUT=$R bash scripts/gpu_sanitize.sh $C > $R/sanitize-C.txt 2>&1; echo "sanitize exit $?"; tail -3 $R/sanitize-C.txt
AB_CHECK=none AB_STEP_S=28 AB_ARGS="-b 16M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" OUT=$R bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B .carry/bin-C > $R/ab.log 2>&1
echo "ab exit $?"; cat $R/ab/summary.txt
cd $OUT && tar czf r.tgz r && rm -rf r

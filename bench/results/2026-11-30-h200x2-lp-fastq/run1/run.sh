#!/usr/bin/env bash
# Call 1: quantization alone on main (A), Nsight Compute on the encode kernel, then wip/lp-sig (B):
# gpu_check_lowp (with its disagreeing calls) and compute-sanitizer over gpu_check_lowp.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=10
A=$PWD/.carry/bin-A; B=$PWD/.carry/bin-B
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
which ncu >> $R/gpu.txt 2>&1; ncu --version >> $R/gpu.txt 2>&1
for i in 1 2; do
  timeout 60 $A/ferrocomm launch -n 1 --timeout 55 -- $A/gpu_check_lowp --quant-time > $R/quant-time-A-$i.txt 2>&1; echo "quant-time A $i exit $?"; tail -2 $R/quant-time-A-$i.txt
done
# bf16 64 MB: launches 0..143 are the codec check, 144 the warm-up.
for spec in "bf16-64M 145" "bf16-256M 166" "f32-256M 187"; do
  set -- $spec
  timeout 100 ncu -k regex:fc_lp_encode -s $2 -c 1 --set full -o $R/enc-$1 $A/ferrocomm launch -n 1 --timeout 95 -- $A/gpu_check_lowp --quant-time > $R/ncu-$1.log 2>&1
  echo "ncu $1 exit $?"
  ncu -i $R/enc-$1.ncu-rep --page details > $R/enc-$1-details.txt 2>&1
  ncu -i $R/enc-$1.ncu-rep --page raw --csv > $R/enc-$1-raw.csv 2>&1
  grep -E "Duration|Memory Throughput|DRAM Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Warp Cycles Per Issued" $R/enc-$1-details.txt | head -12
done
timeout 110 $B/ferrocomm launch -n 2 --timeout 105 -- $B/gpu_check_lowp > $R/check-lowp-B.txt 2>&1; echo "check B exit $?"; tail -3 $R/check-lowp-B.txt; grep -i -E "FAIL|disagree" $R/check-lowp-B.txt | head
SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 OUT=$R bash scripts/gpu_sanitize.sh $B > $R/sanitize-B.txt 2>&1; echo "sanitize exit $?"; tail -4 $R/sanitize-B.txt
cd $OUT && tar czf r.tgz r && rm -rf r

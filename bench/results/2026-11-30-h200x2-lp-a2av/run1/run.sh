#!/usr/bin/env bash
# Call 1: variant A (wip/lp-a2av): low-precision all_to_all_v checked, its speed, the
# full-precision all_to_all_v table against NCCL, the bf16 all-reduce's 256 MB row, sanitizer.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
B=$PWD/.carry/bin-A; F=$B/ferrocomm
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 200 $F launch -n 2 -- $B/gpu_check_lowp > $R/check_lowp.txt 2>&1; echo "check_lowp exit $? $(( $(date +%s)-t ))s"
grep -E "passed|failed|FAIL|a2av|all_to_all_v" $R/check_lowp.txt | tail -15
run() { local name=$1; local lim=$2; shift 2; t=$(date +%s); FERROCOMM_TIMEOUT_S=10 timeout $lim $F bench "$@" -g 2 --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?, $(( $(date +%s)-t ))s)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $14, $15, $16, $17, $18}'; }
run a2av-lp-bf16 90 all_to_all_v -d bfloat16 -b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
run a2av-lp-f32 60 all_to_all_v -d float -b 16M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
run a2av-fp-bf16 120 all_to_all_v -d bfloat16 -b 1K -e 256M -f 4 -n 20 --reps 3 -G 10 --vs nccl
run ar-lp-bf16-256M 90 all_reduce -d bfloat16 -b 256M -e 256M -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
t=$(date +%s)
OUT=$R SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 bash scripts/gpu_sanitize.sh $B 2>&1 | tail -5; echo "sanitize $(( $(date +%s)-t ))s"
grep -hE "ERROR SUMMARY|passed|failed" $R/sanitize-*.log | tail -6
cd $OUT && tar czf r.tgz r && rm -rf r

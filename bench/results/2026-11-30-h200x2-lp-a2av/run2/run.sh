#!/usr/bin/env bash
# Call 2: variant B (all_to_all_v in pieces, full and low precision): checks, sanitizer, speed.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
B=$PWD/.carry/bin-B; F=$B/ferrocomm
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 200 $F launch -n 2 -- $B/gpu_check_lowp --no-timing > $R/check_lowp.txt 2>&1; echo "check_lowp exit $? $(( $(date +%s)-t ))s"
grep -E "passed|failed|FAIL|all_to_all_v" $R/check_lowp.txt | tail -8
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 240 $F launch -n 2 -- $B/gpu_check_coll > $R/check_coll.txt 2>&1; echo "check_coll exit $? $(( $(date +%s)-t ))s"
grep -E "passed|failed|FAIL|pieces|step" $R/check_coll.txt | tail -12
run() { local name=$1; local lim=$2; shift 2; t=$(date +%s); FERROCOMM_TIMEOUT_S=10 timeout $lim $F bench "$@" -g 2 --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?, $(( $(date +%s)-t ))s)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $14, $15, $16}'; }
run a2av-lp-bf16 90 all_to_all_v -d bfloat16 -b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
run a2av-lp-f32 60 all_to_all_v -d float -b 256M -e 256M -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
run a2av-direct-bf16 90 all_to_all_v -d bfloat16 -b 1M -e 256M -f 2 -n 20 --reps 3 -G 10 --algo direct --vs nccl
t=$(date +%s)
OUT=$R SANITIZE_PROGRAMS=gpu_check_lowp SANITIZE_RUN_TIMEOUT_S=150 bash scripts/gpu_sanitize.sh $B 2>&1 | tail -3; echo "sanitize $(( $(date +%s)-t ))s"
grep -hE "ERROR SUMMARY|passed|failed|pieces" $R/sanitize-*.log | tail -8
cd $OUT && tar czf r.tgz r && rm -rf r

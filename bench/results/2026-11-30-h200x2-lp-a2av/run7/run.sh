#!/usr/bin/env bash
# Call 7: L2 (LL all-to-all-v at two ranks; staged all-to-all-v's barrier words carry a
# signature over both crossing counts): gpu_check_coll, sanitizer, the all-to-all-v table.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
B=$PWD/.carry/bin-L2; F=$B/ferrocomm
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 200 $F launch -n 2 -- $B/gpu_check_coll > $R/check_coll.txt 2>&1; echo "check_coll exit $? $(( $(date +%s)-t ))s"
grep -E "mismatch|FAIL|correct" $R/check_coll.txt | tail -8; grep -E "^\[rank 0\] [a-z_0-9]+ +[0-9]+ +[0-9]+" $R/check_coll.txt
run() { local name=$1; local lim=$2; shift 2; t=$(date +%s); FERROCOMM_TIMEOUT_S=10 timeout $lim $F bench "$@" -g 2 --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?, $(( $(date +%s)-t ))s)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $14, $15, $16}'; }
run a2av-fp-bf16 120 all_to_all_v -d bfloat16 -b 1K -e 256M -f 4 -n 20 --reps 3 -G 10 --vs nccl
run a2av-fp-bf16-eager 120 all_to_all_v -d bfloat16 -b 1K -e 1M -f 4 -n 20 --reps 3 --vs nccl
t=$(date +%s)
OUT=$R SANITIZE_PROGRAMS=gpu_check_coll SANITIZE_RUN_TIMEOUT_S=200 bash scripts/gpu_sanitize.sh $B 2>&1 | tail -3; echo "sanitize $(( $(date +%s)-t ))s"
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|correct|FAIL" $R/sanitize-*.log | tail -8
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Call 3: C (all_to_all_v in pieces, no a2av limit): gpu_check_coll, a2av tables; then an A/B of
# push at every size where it needs no more chunks than pull (D), and D with a 128 MiB staging.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
B=$PWD/.carry/bin-C; F=$B/ferrocomm
t=$(date +%s)
FERROCOMM_TIMEOUT_S=10 timeout 240 $F launch -n 2 -- $B/gpu_check_coll > $R/check_coll.txt 2>&1; echo "check_coll exit $? $(( $(date +%s)-t ))s"
grep -E "passed|failed|FAIL|pieces|step" $R/check_coll.txt | tail -12
run() { local name=$1; local lim=$2; shift 2; t=$(date +%s); FERROCOMM_TIMEOUT_S=10 timeout $lim $F bench "$@" -g 2 --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?, $(( $(date +%s)-t ))s)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $14, $15, $16}'; }
run a2av-fp-bf16 120 all_to_all_v -d bfloat16 -b 1K -e 256M -f 4 -n 20 --reps 3 -G 10 --vs nccl
run a2av-fp-f32 60 all_to_all_v -d float -b 64M -e 256M -f 4 -n 20 --reps 3 -G 10 --vs nccl
run a2av-lp-f32 60 all_to_all_v -d float -b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl
AB_CHECK=gpu_check_lowp AB_STEP_S=40 AB_BENCHES="all_to_all bfloat16;all_reduce bfloat16;all_gather bfloat16;reduce_scatter bfloat16" \
  AB_ARGS="-b 64M -e 256M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" OUT=$R \
  timeout 330 bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-D .carry/bin-D@FERROCOMM_CUDA_STAGING_BYTES=128M 2>&1 | tail -40
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# main (e9d59d7): full vs low precision for all-gather and all-to-all, 16-256 MB; LP all-reduce to 256 MB.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=10
F=.carry/bin-A/ferrocomm
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
run() { local name=$1; shift; timeout 45 $F bench "$@" --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $15, $16, $17, $18}'; }
A="-g 2 -d bfloat16 -n 10 --reps 2 -G 10 --vs nccl"
run all_gather-fp all_gather $A -b 16M -e 256M -f 2
run all_gather-lp all_gather $A -b 16M -e 256M -f 2 --low-precision e4m3
run all_to_all-fp all_to_all $A -b 16M -e 256M -f 2
run all_to_all-lp all_to_all $A -b 16M -e 256M -f 2 --low-precision e4m3
run all_reduce-bf16-lp all_reduce $A -b 16M -e 256M -f 4 --low-precision e4m3
run all_reduce-f32-lp all_reduce -g 2 -d float -n 10 --reps 2 -G 10 --vs nccl -b 16M -e 256M -f 4 --low-precision e4m3
cd $OUT && tar czf r.tgz r && rm -rf r

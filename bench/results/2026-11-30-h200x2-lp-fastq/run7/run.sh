#!/usr/bin/env bash
# Call 7: M, the two 256 MB rows run6's per-bench limit cut.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=10
F=$PWD/.carry/bin-M/ferrocomm
run() { local name=$1; shift; timeout 80 $F bench "$@" -g 2 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $15, $16, $17, $18}'; }
run all_reduce-bf16-256M all_reduce -d bfloat16 -b 256M -e 256M
run all_to_all-bf16-256M all_to_all -d bfloat16 -b 256M -e 256M
cd $OUT && tar czf r.tgz r && rm -rf r

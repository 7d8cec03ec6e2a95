#!/usr/bin/env bash
# Call 6: M = main f7257bc (the landed build): quantization alone and the low-precision table with
# NCCL in the same run, 16-256 MB.
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=10
M=$PWD/.carry/bin-M; F=$M/ferrocomm
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
timeout 60 $F launch -n 1 --timeout 55 -- $M/gpu_check_lowp --quant-time > $R/quant-time.txt 2>&1; echo "quant-time exit $?"; tail -2 $R/quant-time.txt
run() { local name=$1; shift; timeout 62 $F bench "$@" -g 2 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $15, $16, $17, $18}'; }
run all_reduce-bf16 all_reduce -d bfloat16 -b 16M -e 256M -f 4
run all_reduce-f32 all_reduce -d float -b 16M -e 256M -f 4
run all_gather-bf16 all_gather -d bfloat16 -b 16M -e 256M -f 4
run all_to_all-bf16 all_to_all -d bfloat16 -b 16M -e 256M -f 4
cd $OUT && tar czf r.tgz r && rm -rf r

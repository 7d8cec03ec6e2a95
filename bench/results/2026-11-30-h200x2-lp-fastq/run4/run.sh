#!/usr/bin/env bash
# Call 4: T = main + LP_TRACE (printf of phase times from the first and last CTA of fc_lp_move):
# where the time of each low-precision collective goes (quantize+push, barrier, decode).
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=10
F=$PWD/.carry/bin-T/ferrocomm
run() { local name=$1; shift; timeout 40 $F bench "$@" -g 2 -n 4 -w 2 --reps 1 -G 4 --low-precision e4m3 > $R/$name.txt 2>&1; echo "== $name (exit $?)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10}'; grep lp_trace $R/$name.txt | tail -8; }
run ar-bf16-16M all_reduce -d bfloat16 -b 16M -e 16M
run ag-bf16-16M all_gather -d bfloat16 -b 16M -e 16M
run ar-f32-16M all_reduce -d float -b 16M -e 16M
run a2a-bf16-16M all_to_all -d bfloat16 -b 16M -e 16M
run ar-bf16-4M all_reduce -d bfloat16 -b 4M -e 4M
run rs-bf16-16M reduce_scatter -d bfloat16 -b 16M -e 16M
cd $OUT && tar czf r.tgz r && rm -rf r

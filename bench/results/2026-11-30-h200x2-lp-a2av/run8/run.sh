#!/usr/bin/env bash
# Call 8: main (the build of this stop): the Python package against torch.distributed, then the
# full-precision tables of every collective against NCCL (bf16, graph mode, 1 KB to 256 MB).
set -u
R=$OUT/r; mkdir -p $R
export FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc NCCL_NVLS_ENABLE=0
OUT=$R timeout 300 bash scripts/gpu_session.sh .carry/bin .carry/kc python > /dev/null 2>&1
cat $R/session/summary.txt
F=$PWD/.carry/bin/ferrocomm
run() { local name=$1; local lim=$2; shift 2; t=$(date +%s); FERROCOMM_TIMEOUT_S=10 timeout $lim $F bench "$@" -g 2 --json $R/$name.json > $R/$name.txt 2>&1; echo "== $name (exit $?, $(( $(date +%s)-t ))s)"; grep -E '^ +[0-9]' $R/$name.txt | awk '{print $1, $6, $10, $14, $15, $16}'; }
for c in all_reduce all_gather reduce_scatter all_to_all all_to_all_v broadcast reduce; do
  run fp-$c 60 $c -d bfloat16 -b 1K -e 256M -f 4 -n 10 --reps 3 -G 10 --vs nccl
done
cd $OUT && tar czf r.tgz r && rm -rf r

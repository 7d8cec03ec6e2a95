# Every collective, 1 KB to 16 MB, bf16, graph mode, NCCL in the same run, with the bench's
# device-side start (D = main e037b14; carry [".carry"] with .carry/pack.tgz holding bin-D and
# the kernel cache). Tables and JSON under $OUT, packed.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
D=.carry/bin-D
mkdir -p $OUT/t
for c in all_reduce all_gather reduce_scatter all_to_all all_to_all_v broadcast reduce; do
  timeout 70 $D/ferrocomm bench $c -g 2 -d bfloat16 -b 1K -e 16M -f 4 -n 10 --reps 3 -G 10 --vs nccl \
    --json $OUT/t/$c.json > $OUT/t/$c.txt 2>&1
  echo "== $c rc=$?"; grep -E '^ +[0-9]' $OUT/t/$c.txt | awk '{print $1, $6, $14, $15, $16}'
done
(cd $OUT && tar czf tables.tgz t && rm -rf t)

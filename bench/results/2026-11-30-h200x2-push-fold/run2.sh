# Z = the final tree: the fold loop at every world size (the two-rank paths removed)
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin-Z
timeout 100 $Z/ferrocomm launch -n 2 --timeout 98 -- $Z/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "gpu_check 2 rc=$?"; tail -1 $OUT/check2.txt
timeout 120 $Z/ferrocomm launch -n 3 --timeout 118 -- $Z/gpu_check --quick --share-gpus > $OUT/check3.txt 2>&1; echo "gpu_check 3 rc=$?"; tail -1 $OUT/check3.txt
timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_coll --quick > $OUT/coll2.txt 2>&1; echo "coll2 rc=$?"; tail -1 $OUT/coll2.txt
mkdir -p $OUT/bench
for c in all_reduce reduce_scatter; do
  timeout 40 $Z/ferrocomm bench $c -g 2 -d bfloat16 -b 1K -e 64K -f 4 -n 20 --reps 3 -G 10 --vs nccl > $OUT/bench/$c.txt 2>&1; echo "bench $c rc=$?"
done
SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS="gpu_check gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -4 $OUT/sanitize.txt
tar czf $OUT/logs.tgz -C $OUT bench check2.txt check3.txt coll2.txt $(cd $OUT && ls sanitize-*.log) && rm -rf $OUT/*.log $OUT/check*.txt $OUT/coll2.txt
for c in all_reduce reduce_scatter; do echo "== $c"; grep -E '^ +[0-9]' $OUT/bench/$c.txt | awk '{print $1, $6, $9, $10, $13, $14, $15, $16}'; done

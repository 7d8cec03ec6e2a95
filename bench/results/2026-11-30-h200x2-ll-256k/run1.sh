# B = the working tree (LL up to 256 KiB parts by default); C = B + a two-rank receive loop in push
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-B C=.carry/bin-C
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=60 AB_BENCHES="all_reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$OUT \
  bash scripts/gpu_ab.sh .carry/kc $B $C $B@X=2 $C@X=2 > /dev/null 2>&1
mv $OUT/ab $OUT/ab-ar
mkdir -p $OUT/bench
for coll in all_gather reduce_scatter all_to_all broadcast reduce all_reduce; do
  timeout 90 $B/ferrocomm bench $coll -g 2 -d bfloat16 -b 1K -e 16M -f 4 -n 10 --reps 2 -G 10 --vs nccl \
    --json $OUT/bench/$coll.json > $OUT/bench/$coll.txt 2>&1; echo "bench $coll rc=$?"
done
for w in 2 3; do
  f=""; [ $w = 3 ] && f=--share-gpus
  timeout 200 $B/ferrocomm launch -n $w --timeout 198 -- $B/gpu_check_coll --quick $f > $OUT/coll$w.txt 2>&1; echo "coll$w rc=$?"; tail -1 $OUT/coll$w.txt
  timeout 150 $C/ferrocomm launch -n $w --timeout 148 -- $C/gpu_check --quick --no-timing $f > $OUT/checkC$w.txt 2>&1; echo "gpu_check C $w rc=$?"; tail -1 $OUT/checkC$w.txt
done
SANITIZE_RUN_TIMEOUT_S=200 SANITIZE_PROGRAMS=gpu_check_coll OUT=$OUT bash scripts/gpu_sanitize.sh $B > $OUT/sanitize.txt 2>&1; tail -2 $OUT/sanitize.txt
cp $OUT/ab-ar/summary.txt $OUT/summary-ab.txt; rm -f $OUT/ab-ar/*.json
tar czf $OUT/logs.tgz -C $OUT ab-ar bench coll2.txt coll3.txt checkC2.txt checkC3.txt sanitize-memcheck-gpu_check_coll.log sanitize-racecheck-gpu_check_coll.log && rm -rf $OUT/ab-ar $OUT/*.log $OUT/coll*.txt $OUT/checkC*.txt
awk '/^==/{print; next} {print $1, $6, $10, $14, $15, $16}' $OUT/summary-ab.txt
for coll in all_gather reduce_scatter all_to_all broadcast reduce all_reduce; do echo "== $coll"; grep -E '^ +[0-9]' $OUT/bench/$coll.txt | awk '{print $1, $6, $10, $14, $15, $16}'; done

# A = main 55b2c42, B = the working tree (LL hellos from the last warp, no hello wait before data)
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-B
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=60 \
AB_BENCHES="all_gather bfloat16;all_to_all bfloat16;broadcast bfloat16;all_reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$OUT \
  bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B .carry/bin-A@X=2 .carry/bin-B@X=2 > /dev/null 2>&1
cp $OUT/ab/summary.txt $OUT/summary-ab.txt; rm -f $OUT/ab/*.json
for w in 2 3; do
  f=""; [ $w = 3 ] && f=--share-gpus
  timeout 200 $B/ferrocomm launch -n $w --timeout 198 -- $B/gpu_check_coll --quick $f > $OUT/coll$w.txt 2>&1; echo "coll$w rc=$?"; tail -2 $OUT/coll$w.txt
done
timeout 120 $B/ferrocomm launch -n 2 --timeout 118 -- $B/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "check2 rc=$?"; tail -1 $OUT/check2.txt
timeout 120 $B/ferrocomm launch -n 2 --timeout 118 -- $B/gpu_check_lowp --quick > $OUT/lowp2.txt 2>&1; echo "lowp2 rc=$?"; tail -1 $OUT/lowp2.txt
SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS=gpu_check_coll OUT=$OUT bash scripts/gpu_sanitize.sh $B > $OUT/sanitize.txt 2>&1; tail -2 $OUT/sanitize.txt
tar czf $OUT/logs.tgz -C $OUT ab coll2.txt coll3.txt check2.txt lowp2.txt sanitize-memcheck-gpu_check_coll.log sanitize-racecheck-gpu_check_coll.log && rm -rf $OUT/ab $OUT/*.log
awk '/^==/{print; next} {print $1, $6, $9, $14, $15, $16}' $OUT/summary-ab.txt

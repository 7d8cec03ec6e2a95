# A = main 2a890d9, B = the working tree (push: own unit from the input, no LL line of its own;
# FERROCOMM_LL_MAX_BYTES)
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-B
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=60 AB_BENCHES="all_reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$OUT \
  bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B .carry/bin-A@X=2 .carry/bin-B@X=2 > /dev/null 2>&1
mv $OUT/ab $OUT/ab-ar
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=60 \
AB_BENCHES="all_gather bfloat16;all_to_all bfloat16;broadcast bfloat16" \
AB_ARGS="-b 64K -e 2M -f 2 -n 20 --reps 3 -G 10 --vs nccl" OUT=$OUT \
  bash scripts/gpu_ab.sh .carry/kc .carry/bin-B .carry/bin-B@FERROCOMM_LL_MAX_BYTES=524288 > /dev/null 2>&1
mv $OUT/ab $OUT/ab-ll
timeout 120 $B/ferrocomm launch -n 2 --timeout 118 -- $B/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "check2 rc=$?"; tail -1 $OUT/check2.txt
timeout 150 $B/ferrocomm launch -n 3 --timeout 148 -- $B/gpu_check --quick --share-gpus > $OUT/check3.txt 2>&1; echo "check3 rc=$?"; tail -1 $OUT/check3.txt
for w in 2 3; do
  f=""; [ $w = 3 ] && f=--share-gpus
  FERROCOMM_LL_MAX_BYTES=524288 timeout 200 $B/ferrocomm launch -n $w --timeout 198 -- $B/gpu_check_coll --quick $f > $OUT/coll$w.txt 2>&1; echo "coll$w (LL to 512K) rc=$?"; tail -1 $OUT/coll$w.txt
done
SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS=gpu_check OUT=$OUT bash scripts/gpu_sanitize.sh $B > $OUT/sanitize.txt 2>&1; tail -2 $OUT/sanitize.txt
cat $OUT/ab-ar/summary.txt $OUT/ab-ll/summary.txt > $OUT/summary-ab.txt
rm -f $OUT/ab-*/*.json
tar czf $OUT/logs.tgz -C $OUT ab-ar ab-ll check2.txt check3.txt coll2.txt coll3.txt sanitize-memcheck-gpu_check.log sanitize-racecheck-gpu_check.log && rm -rf $OUT/ab-* $OUT/*.log
awk '/^==/{print; next} {print $1, $6, $10, $14, $15, $16}' $OUT/summary-ab.txt

# B = the working tree: LL reduce-scatter and reduce (two-rank receive as push); staged by FERROCOMM_LL_MAX_BYTES=0
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-B
for w in 2 3; do
  f=""; [ $w = 3 ] && f=--share-gpus
  timeout 200 $B/ferrocomm launch -n $w --timeout 198 -- $B/gpu_check_coll --quick $f > $OUT/coll$w.txt 2>&1; echo "coll$w rc=$?"; tail -1 $OUT/coll$w.txt
done
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=60 AB_BENCHES="reduce_scatter bfloat16;reduce bfloat16" \
AB_ARGS="-b 1K -e 1M -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$OUT \
  bash scripts/gpu_ab.sh .carry/kc $B@FERROCOMM_LL_MAX_BYTES=0 $B $B@FERROCOMM_LL_MAX_BYTES=0,X=2 $B@X=2 > /dev/null 2>&1
mkdir -p $OUT/bench
timeout 90 $B/ferrocomm bench all_to_all_v -g 2 -d bfloat16 -b 1K -e 16M -f 4 -n 10 --reps 2 -G 10 --vs nccl \
  --json $OUT/bench/all_to_all_v.json > $OUT/bench/all_to_all_v.txt 2>&1; echo "bench a2av rc=$?"
SANITIZE_RUN_TIMEOUT_S=200 SANITIZE_PROGRAMS="gpu_check gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $B > $OUT/sanitize.txt 2>&1; tail -4 $OUT/sanitize.txt
cp $OUT/ab/summary.txt $OUT/summary-ab.txt; rm -f $OUT/ab/*.json
tar czf $OUT/logs.tgz -C $OUT ab bench coll2.txt coll3.txt sanitize-memcheck-gpu_check.log sanitize-racecheck-gpu_check.log sanitize-memcheck-gpu_check_coll.log sanitize-racecheck-gpu_check_coll.log && rm -rf $OUT/ab $OUT/*.log $OUT/coll*.txt
awk '/^==/{print; next} {print $1, $6, $10, $14, $15, $16}' $OUT/summary-ab.txt
grep -E '^ +[0-9]' $OUT/bench/all_to_all_v.txt | awk '{print $1, $6, $10, $14, $15, $16}'

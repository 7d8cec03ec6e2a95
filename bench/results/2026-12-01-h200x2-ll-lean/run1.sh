# A = main abed616, B = the LL kernels' lean start (ll_begin: first unit before the epoch word,
# each peer's region once, two-rank builds W=2) and push's two-rank build.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-B
timeout 150 $B/ferrocomm launch -n 2 --timeout 148 -- $B/gpu_check_coll --quick > $OUT/coll2.txt 2>&1; echo "coll2 rc=$?"; tail -1 $OUT/coll2.txt
timeout 150 $B/ferrocomm launch -n 3 --timeout 148 -- $B/gpu_check_coll --quick --share-gpus > $OUT/coll3.txt 2>&1; echo "coll3 rc=$?"; tail -1 $OUT/coll3.txt
timeout 100 $B/ferrocomm launch -n 2 --timeout 98 -- $B/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "gpu_check 2 rc=$?"; tail -1 $OUT/check2.txt
timeout 120 $B/ferrocomm launch -n 3 --timeout 118 -- $B/gpu_check --quick --share-gpus --no-timing > $OUT/check3.txt 2>&1; echo "gpu_check 3 rc=$?"; tail -1 $OUT/check3.txt
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=25 \
AB_BENCHES="all_gather bfloat16;reduce_scatter bfloat16;all_to_all bfloat16;broadcast bfloat16;reduce bfloat16;all_reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 2 -G 10 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B > $OUT/ab.txt 2>&1; echo "ab rc=$?"
tar czf $OUT/logs.tgz -C $OUT coll2.txt coll3.txt check2.txt check3.txt ab && rm -rf $OUT/coll*.txt $OUT/check*.txt
cat $OUT/ab/summary.txt | cut -c1-160

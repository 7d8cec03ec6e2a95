# A = main abed616; B = run1's B; B2 = B with reduce as before (no first-unit load ahead, one
# build for every world); B3 = B2 with the two-rank build (W=2) of reduce.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin-B3
timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_coll --quick > $OUT/coll2.txt 2>&1; echo "coll2 rc=$?"; tail -1 $OUT/coll2.txt
timeout 150 $Z/ferrocomm launch -n 3 --timeout 148 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/coll3.txt 2>&1; echo "coll3 rc=$?"; tail -1 $OUT/coll3.txt
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=25 \
AB_BENCHES="reduce bfloat16;all_gather bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 2 -G 10 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B .carry/bin-B2 .carry/bin-B3 > $OUT/ab.txt 2>&1; echo "ab rc=$?"
tar czf $OUT/logs.tgz -C $OUT coll2.txt coll3.txt ab && rm -rf $OUT/coll*.txt
awk '/^==/{print} /^ +[0-9]/{print $1, $6, $10, $15, $16, $17}' $OUT/ab/summary.txt

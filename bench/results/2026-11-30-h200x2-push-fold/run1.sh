# F = the working tree: push and the LL reductions fold one rank at a time above two ranks (no
# loop unrolled over sixteen ranks); G = F with the two-rank paths switched off (measurement only:
# the general loop timed at two ranks)
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
F=.carry/bin-F G=.carry/bin-G
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=60 AB_BENCHES="all_reduce bfloat16;reduce_scatter bfloat16" \
AB_ARGS="-b 1K -e 64K -f 4 -n 20 --reps 3 -G 10 --vs nccl" OUT=$OUT \
  bash scripts/gpu_ab.sh .carry/kc $F $G $F@X=2 $G@X=2 > /dev/null 2>&1
for w in 3 4; do
  timeout 150 $F/ferrocomm launch -n $w --timeout 148 -- $F/gpu_check --quick --share-gpus > $OUT/check$w.txt 2>&1; echo "gpu_check $w rc=$?"; tail -1 $OUT/check$w.txt
done
timeout 200 $F/ferrocomm launch -n 3 --timeout 198 -- $F/gpu_check_coll --quick --share-gpus > $OUT/coll3.txt 2>&1; echo "coll3 rc=$?"; tail -1 $OUT/coll3.txt
timeout 100 $F/ferrocomm launch -n 2 --timeout 98 -- $F/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "gpu_check 2 rc=$?"; tail -1 $OUT/check2.txt
SANITIZE_WORLD=3 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS="gpu_check gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $F > $OUT/sanitize.txt 2>&1; tail -4 $OUT/sanitize.txt
cp $OUT/ab/summary.txt $OUT/summary-ab.txt; rm -f $OUT/ab/*.json
tar czf $OUT/logs.tgz -C $OUT ab check2.txt check3.txt check4.txt coll3.txt $(cd $OUT && ls sanitize-*.log) && rm -rf $OUT/ab $OUT/*.log $OUT/check*.txt $OUT/coll3.txt
awk '/^==/{print; next} {print $1, $6, $10, $14, $15, $16}' $OUT/summary-ab.txt

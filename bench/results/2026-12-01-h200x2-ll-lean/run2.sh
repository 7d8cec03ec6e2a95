# A = main abed616; C = main 44c4378 (run1's B with reduce as before, no first unit loaded ahead,
# and its two-rank build: the form kept). Correctness of C at 2 ranks and at 3 sharing the GPUs,
# then every LL collective timed side by side.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin-C
timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_coll --quick > $OUT/coll2.txt 2>&1; echo "coll2 rc=$?"; tail -1 $OUT/coll2.txt
timeout 100 $Z/ferrocomm launch -n 2 --timeout 98 -- $Z/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "gpu_check 2 rc=$?"; tail -1 $OUT/check2.txt
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=25 \
AB_BENCHES="reduce bfloat16;all_gather bfloat16;reduce_scatter bfloat16;all_to_all bfloat16;broadcast bfloat16;all_reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 2 -G 10 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-C > $OUT/ab.txt 2>&1; echo "ab rc=$?"
# The ranks' start skew: D = C's kernels with the bench that starts a GPU measurement after a
# device-side line-up (one-element all-reduce on the stream), against --host-start (the old way)
# and against ten times the graph replays per measurement.
D=.carry/bin-D
for v in "host-n10:--host-start -n 10" "host-n100:--host-start -n 100" "device-n10:-n 10" "device-n100:-n 100"; do
  name=${v%%:*}
  timeout 45 $D/ferrocomm bench all_gather -g 2 -d bfloat16 -b 1K -e 256K -f 4 --reps 3 -G 10 --vs nccl ${v#*:} > $OUT/skew-$name.txt 2>&1
  echo "skew $name rc=$?"; grep -E '^ +[0-9]' $OUT/skew-$name.txt | awk '{print $1, $6, $10, $15, $16, $17}'
done
# E = C with the LL reduce-scatter's first units loaded before the epoch word (branch
# wip/rs-prefetch 28a2967): its check, then the reduce-scatter against C.
E=.carry/bin-E
timeout 120 $E/ferrocomm launch -n 2 --timeout 118 -- $E/gpu_check_coll --quick > $OUT/coll2-E.txt 2>&1; echo "coll2 E rc=$?"; tail -1 $OUT/coll2-E.txt
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=25 AB_BENCHES="reduce_scatter bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
OUT=$OUT/abE bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-E > $OUT/abE.txt 2>&1; echo "abE rc=$?"
cat $OUT/abE/ab/summary.txt | cut -c1-160
(cd $OUT && tar czf logs.tgz coll2.txt coll2-E.txt check2.txt ab abE skew-*.txt && rm -rf coll*.txt check*.txt skew*.txt abE)
cat $OUT/ab/summary.txt | cut -c1-160

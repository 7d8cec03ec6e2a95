# Two H200, a shorter run2: C's checks on two GPUs; the reduce, A against C (C's two-rank build
# of the LL reduce, not timed before); the ranks' start skew with D (the bench's device-side
# line-up) against --host-start at -n 10; E (the reduce-scatter's first units before the epoch
# word) against C.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin-C
timeout 60 $Z/ferrocomm launch -n 2 --timeout 58 -- $Z/gpu_check_coll --quick > $OUT/coll2.txt 2>&1; echo "coll2 C rc=$?: $(tail -1 $OUT/coll2.txt)"
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=30 AB_BENCHES="reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
OUT=$OUT/abR bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-C > $OUT/abR.txt 2>&1; echo "abR rc=$?"
cat $OUT/abR/ab/summary.txt | cut -c1-175
D=.carry/bin-D
for v in "host-n10:--host-start -n 10" "device-n10:-n 10"; do
  name=${v%%:*}
  timeout 45 $D/ferrocomm bench all_gather -g 2 -d bfloat16 -b 1K -e 256K -f 4 --reps 3 -G 10 --vs nccl ${v#*:} > $OUT/skew-$name.txt 2>&1
  echo "skew $name rc=$?"; grep -E '^ +[0-9]' $OUT/skew-$name.txt | cut -c1-175
done
E=.carry/bin-E
timeout 60 $E/ferrocomm launch -n 2 --timeout 58 -- $E/gpu_check_coll --quick > $OUT/coll2-E.txt 2>&1; echo "coll2 E rc=$?: $(tail -1 $OUT/coll2-E.txt)"
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=30 AB_BENCHES="reduce_scatter bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
OUT=$OUT/abE bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-E > $OUT/abE.txt 2>&1; echo "abE rc=$?"
cat $OUT/abE/ab/summary.txt | cut -c1-175
(cd $OUT && tar czf logs.tgz coll2*.txt abR abE skew-*.txt && rm -rf coll2*.txt abR abE)

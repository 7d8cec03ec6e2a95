# Two H200: B = main with the LL reduce-scatter's first units loaded before the epoch word (the
# ll-lean patch, 7e4317d) against A = main before it (2ce35b3): B's checks on two GPUs, then the
# reduce-scatter (and the reduce, which shares the LL reduction helpers) side by side.
# Pack: A's binaries in .carry/bin-A (scripts/gpu_prepare.sh on 2ce35b3, renamed), then
# scripts/gpu_prepare.sh --variant B; tar czf .carry/pack.tgz -C .carry bin-A bin-B kc, carry
# [".carry"] holding only it.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-B
timeout 60 $B/ferrocomm launch -n 2 --timeout 58 -- $B/gpu_check_coll --quick > $OUT/coll2-B.txt 2>&1; echo "coll2 B rc=$?: $(tail -1 $OUT/coll2-B.txt)"
timeout 100 $B/ferrocomm launch -n 2 --timeout 98 -- $B/gpu_check --quick --no-timing > $OUT/check2-B.txt 2>&1; echo "gpu_check B rc=$?: $(tail -1 $OUT/check2-B.txt)"
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=30 AB_BENCHES="reduce_scatter bfloat16;reduce bfloat16" \
AB_ARGS="-b 1K -e 256K -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-B > $OUT/ab.txt 2>&1; echo "ab rc=$?"
cat $OUT/ab/summary.txt | cut -c1-175
(cd $OUT && tar czf logs.tgz ab coll2-B.txt check2-B.txt && rm -rf ab coll2-B.txt check2-B.txt)

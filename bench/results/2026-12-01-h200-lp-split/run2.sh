# Two H200 (nvidia-h200-x2): F (split push, ec883b3) and G (split push at every size, 18d62a0)
# against C (main 44c4378: the same low-precision code as main) on the low-precision calls,
# with F's and G's gpu_check_lowp on two GPUs first (gpu_ab.sh runs it for every build but the
# first); then the 256 MB rows, C against G, unchecked (-c 0: the bench's host check of 128 M
# elements outlasts the step; gpu_check_lowp covers the chunked calls).
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
AB_PRECOMPILE=none AB_STEP_S=40 \
AB_BENCHES="all_reduce bfloat16;all_gather bfloat16;all_to_all bfloat16;all_reduce float" \
AB_ARGS="-b 1M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-F .carry/bin-G > $OUT/ab.txt 2>&1; echo "ab rc=$?"
cat $OUT/ab/summary.txt | cut -c1-170
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=45 \
AB_BENCHES="all_reduce bfloat16;all_gather bfloat16;all_to_all bfloat16" \
AB_ARGS="-b 256M -e 256M -n 5 --reps 2 -G 10 -c 0 --low-precision e4m3 --vs nccl" \
OUT=$OUT/big bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-G > $OUT/big.txt 2>&1; echo "big rc=$?"
cat $OUT/big/ab/summary.txt | cut -c1-170
(cd $OUT && tar czf logs.tgz ab big ab.txt big.txt && rm -rf big)

# Two H200: the 256 MB rows, C against G, unchecked (-c 0: the bench's host check of 128 M
# elements outlasts the step; gpu_check_lowp covers the chunked calls).
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=45 \
AB_BENCHES="all_reduce bfloat16;all_gather bfloat16;all_to_all bfloat16" \
AB_ARGS="-b 256M -e 256M -n 5 --reps 2 -G 10 -c 0 --low-precision e4m3 --vs nccl" \
OUT=$OUT/big bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-G > $OUT/big.txt 2>&1; echo "big rc=$?"
cat $OUT/big/ab/summary.txt | cut -c1-170
(cd $OUT && tar czf logs-big.tgz big big.txt && rm -rf big)

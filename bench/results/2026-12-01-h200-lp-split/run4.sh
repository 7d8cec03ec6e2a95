# Two H200 (nvidia-h200-x2), a shorter run2: F's and G's gpu_check_lowp --quick on two GPUs,
# then C (main 501496a), F (+ patches 0001-0002, the split push) and G (+ 0003, at every size)
# side by side on the low-precision all-reduce (bf16, f32) and all-gather, 4-64 MB.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
for v in F G; do
  timeout 60 .carry/bin-$v/ferrocomm launch -n 2 --timeout 58 -- .carry/bin-$v/gpu_check_lowp --quick > $OUT/lowp-$v.txt 2>&1
  echo "gpu_check_lowp $v rc=$?: $(tail -1 $OUT/lowp-$v.txt)"
done
AB_PRECOMPILE=none AB_CHECK=none AB_STEP_S=35 \
AB_BENCHES="all_reduce bfloat16;all_reduce float;all_gather bfloat16" \
AB_ARGS="-b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-F .carry/bin-G > $OUT/ab.txt 2>&1; echo "ab rc=$?"
cat $OUT/ab/summary.txt | cut -c1-175
(cd $OUT && tar czf logs.tgz ab ab.txt lowp-*.txt && rm -rf ab lowp-*.txt)

# Two H200 (nvidia-h200-x2): F (main + patches/0001-0002, the split push) and G (+ 0003, at every size)
# against C (main: the same low-precision code without the split) on the low-precision calls,
# with F's and G's gpu_check_lowp on two GPUs first (gpu_ab.sh runs it for every build but the
# first). The 256 MB rows: run3.sh.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
AB_PRECOMPILE=none AB_STEP_S=40 \
AB_BENCHES="all_reduce bfloat16;all_gather bfloat16;all_to_all bfloat16;all_reduce float" \
AB_ARGS="-b 1M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl" \
OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-C .carry/bin-F .carry/bin-G > $OUT/ab.txt 2>&1; echo "ab rc=$?"
cat $OUT/ab/summary.txt | cut -c1-170
(cd $OUT && tar czf logs.tgz ab ab.txt)

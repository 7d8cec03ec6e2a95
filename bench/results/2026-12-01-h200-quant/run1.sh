# One H200: quantization alone (gpu_check_lowp --quant-time: the encode kernel, one wave, 50
# launches back to back, after the GPU codec is checked byte for byte against the CPU's),
# C = main 44c4378's kernels, H = branch wip/quant-fast (eight codes with one branch, the E4M3
# quantizer built with its format known), H2 = H + the block scale by the reciprocal of the
# format's max + bf16 widened from 32-bit words; each twice, alternating. Then H2's
# gpu_check_lowp --quick at 2 ranks sharing the GPU and compute-sanitizer over its --sanitize.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
for r in 1 2; do for v in C H H2; do
  Z=.carry/bin-$v; echo -n "$v: "
  timeout 100 $Z/ferrocomm launch -n 1 -- $Z/gpu_check_lowp --quant-time 2>&1 | grep -E "quantize alone|passed" | sed 's/\[rank 0\] //' | tr '\n' ' '; echo
done; done
Z=.carry/bin-H2
timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_lowp --quick --share-gpus --no-timing > $OUT/lowp2-H2.txt 2>&1; echo "H2 lowp2 rc=$?"; grep -E "failed" $OUT/lowp2-H2.txt | tail -1
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=100 SANITIZE_PROGRAMS="gpu_check_lowp" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize-H2.txt 2>&1; echo "H2 sanitize rc=$?"; grep -E "exit" $OUT/sanitize-H2.txt | tail -2
(cd $OUT && tar czf logs.tgz lowp2-H2.txt sanitize-H2.txt *.log && rm -f *.log lowp2-H2.txt)

# One H200: Q2 = Q with lp_encode4 packing through lp_pack4 (one packing routine for both
# encoders; the four-at-a-time path, the wide kernel's among them, packs with one move too)
# against C = main 44c4378, as run.sh: quantization alone twice each, alternating, then Q2's
# gpu_check_lowp --quick with both ranks on the GPU and compute-sanitizer over --sanitize.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
for r in 1 2; do for v in C Q2; do
  Z=.carry/bin-$v; echo -n "$v: "
  timeout 100 $Z/ferrocomm launch -n 1 -- $Z/gpu_check_lowp --quant-time 2>&1 | grep -E "quantize alone|passed" | sed 's/\[rank 0\] //' | tr '\n' ' '; echo
done; done
Z=.carry/bin-Q2
timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_lowp --quick --share-gpus --no-timing > $OUT/lowp2-Q2.txt 2>&1; echo "Q2 lowp2 rc=$?"; grep -E "failed" $OUT/lowp2-Q2.txt | tail -1
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=100 SANITIZE_PROGRAMS="gpu_check_lowp" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize-Q2.txt 2>&1; echo "Q2 sanitize rc=$?"; grep -E "exit" $OUT/sanitize-Q2.txt | tail -2
(cd $OUT && tar czf logs.tgz lowp2-Q2.txt sanitize-Q2.txt *.log && rm -f *.log lowp2-Q2.txt)

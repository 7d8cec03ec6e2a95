# One H200: G2 = main ac7b72e (the new quantizer) + patches/0001-0003 (the split push, every
# size): gpu_check_lowp --quick at 2 ranks sharing the GPU, then compute-sanitizer over its
# --sanitize mode. Correctness only.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin-G2
timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_lowp --quick --share-gpus --no-timing > $OUT/lowp2-G2.txt 2>&1; echo "G2 lowp2 rc=$?"; grep -E "failed" $OUT/lowp2-G2.txt | tail -1
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=100 SANITIZE_PROGRAMS="gpu_check_lowp" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize-G2.txt 2>&1; echo "G2 sanitize rc=$?"; grep -E "exit" $OUT/sanitize-G2.txt | tail -2
(cd $OUT && tar czf logs-1c.tgz lowp2-G2.txt sanitize-G2.txt *.log && rm -f *.log lowp2-G2.txt)

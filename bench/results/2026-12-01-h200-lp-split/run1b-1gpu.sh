# One H200 again: F = wip/lp-split ec883b3 (the split push for the all-to-all at two ranks too)
# and G = wip/lp-split-always 18d62a0 (F, with the split push at every size for the one-part
# calls, even where it needs more chunks than pull): gpu_check_lowp --quick at 2 ranks sharing
# the GPU, then compute-sanitizer over F's and G's gpu_check_lowp --sanitize.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
for v in F G; do
  Z=.carry/bin-$v
  timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_lowp --quick --share-gpus --no-timing > $OUT/lowp2-$v.txt 2>&1; echo "$v lowp2 rc=$?"; grep -E "FAIL|failed" $OUT/lowp2-$v.txt | tail -3
  mkdir -p $OUT/san-$v
  SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=100 SANITIZE_PROGRAMS="gpu_check_lowp" OUT=$OUT/san-$v bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize-$v.txt 2>&1; echo "$v sanitize rc=$?"; grep -E "exit|SUMMARY" $OUT/sanitize-$v.txt | tail -4
done
(cd $OUT && tar czf logs-1b.tgz lowp2-*.txt sanitize-*.txt san-F san-G && rm -rf lowp2-*.txt san-F san-G)

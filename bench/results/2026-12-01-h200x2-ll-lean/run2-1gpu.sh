# One H200 (the two-GPU machine was not available): B2 and B3 with every rank on the one GPU
# (--share-gpus): gpu_check_coll at 2 ranks (the two-rank builds) and 3 (the builds for any
# world), gpu_check at 2 and 3; compute-sanitizer memcheck and racecheck over gpu_check and
# gpu_check_coll of B3 at 2 ranks sharing the GPU. Correctness only: no timing means anything here.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
for v in B2 B3; do
  Z=.carry/bin-$v
  for n in 2 3; do
    timeout 100 $Z/ferrocomm launch -n $n --timeout 98 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/coll$n-$v.txt 2>&1; echo "$v coll$n rc=$?"; tail -1 $OUT/coll$n-$v.txt
    timeout 80 $Z/ferrocomm launch -n $n --timeout 78 -- $Z/gpu_check --quick --share-gpus --no-timing > $OUT/check$n-$v.txt 2>&1; echo "$v check$n rc=$?"; tail -1 $OUT/check$n-$v.txt
  done
done
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS="gpu_check gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh .carry/bin-B3 > $OUT/sanitize.txt 2>&1; tail -6 $OUT/sanitize.txt
tar czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.txt *.log 2>/dev/null) && rm -f $OUT/*.log $OUT/coll*.txt $OUT/check*.txt

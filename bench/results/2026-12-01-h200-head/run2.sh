# The LL128 all-reduce (FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M: every flat all-reduce of the
# check by it: every dtype and operator, 1 element to 64 MB, odd counts, off-alignment pointers,
# in and out of place, 300 back-to-back mixed calls, graph capture and replay, mismatched calls,
# a lone rank's timeout), ranks sharing the one GPU (--share-gpus, NCCL off: correctness only,
# and the two processes take turns on the GPU, so a torn line cannot show here): 2 ranks, then
# 3 (the any-world fold); compute-sanitizer memcheck and racecheck over gpu_check --sanitize with
# it; then the default paths again (the kernels' Args grew by two words): the three programs.
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=30 FERROCOMM_DEBUG=1
Z=.carry/bin
FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M $Z/ferrocomm info 2>&1 | grep -i "ll128" > $OUT/info.txt
for n in 2 3; do
  FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M timeout 200 $Z/ferrocomm launch -n $n --timeout 198 -- \
    $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-ll128-n$n.txt 2>&1
  echo "gpu_check (ll128, $n ranks) rc=$?: $(grep -E 'all results|FAILED' $OUT/gpu_check-ll128-n$n.txt | tail -1)"
  grep -E 'FAIL|wrong|rror' $OUT/gpu_check-ll128-n$n.txt | grep -v mismatch | head -8
done
FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M FERROCOMM_TIMEOUT_S=120 SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus \
  SANITIZE_RUN_TIMEOUT_S=120 SANITIZE_PROGRAMS="gpu_check" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1
tail -3 $OUT/sanitize.txt
for p in gpu_check gpu_check_coll gpu_check_lowp; do
  timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/$p --quick --no-timing --share-gpus > $OUT/$p.txt 2>&1
  echo "$p rc=$?: $(grep -E 'all results|passed|FAILED' $OUT/$p.txt | tail -1)"
done

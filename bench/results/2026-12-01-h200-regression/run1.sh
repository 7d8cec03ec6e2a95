# One H200, every rank on the one GPU (--share-gpus, NCCL off: correctness only): the whole
# device check suite on the day's final kernels (collectives.cu changed for the packed
# device-count call; every module rebuilt): gpu_check, gpu_check_coll and gpu_check_lowp
# --quick at 2 and 3 ranks, compute-sanitizer memcheck and racecheck over the --sanitize mode of
# gpu_check and gpu_check_lowp at 2 ranks (gpu_check_coll's ran in the dynamic-rows runs), and
# the Python checks at 2 ranks.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
for n in 2 3; do
  for p in gpu_check gpu_check_coll gpu_check_lowp; do
    extra=""; [ $p = gpu_check ] && extra=--no-timing
    timeout 200 $Z/ferrocomm launch -n $n --timeout 198 -- $Z/$p --quick --share-gpus $extra > $OUT/$p-$n.txt 2>&1
    echo "$p $n ranks rc=$?: $(tail -1 $OUT/$p-$n.txt)"
  done
done
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=200 SANITIZE_PROGRAMS="gpu_check gpu_check_lowp" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -6 $OUT/sanitize.txt
python3 -m pip install -q --no-deps --no-index dist/*.whl > $OUT/pip.txt 2>&1
for p in check_dynamic check_lists; do
  timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- python3 python/tests/gpu/$p.py --share-gpus > $OUT/$p.txt 2>&1; echo "$p rc=$?"; grep -E "summary|FAIL" $OUT/$p.txt | head -4
done

# One H200, every rank on the one GPU (--share-gpus, NCCL off: correctness only): the check
# suite on main d7ad438 (collectives.cu changed for the device-count all-to-all-v, so every
# module was rebuilt; send/recv by direct access at two ranks): gpu_check, gpu_check_coll and
# gpu_check_lowp --quick at 2 and 3 ranks, check_lists.py at 2 ranks.
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
python3 -m pip install -q --no-deps --no-index --target /tmp/fc-site dist/*.whl > $OUT/pip.txt 2>&1
PYTHONPATH=/tmp/fc-site timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- python3 python/tests/gpu/check_lists.py --share-gpus > $OUT/check_lists.txt 2>&1; echo "check_lists rc=$?"; grep -E "summary|FAIL" $OUT/check_lists.txt | head -4

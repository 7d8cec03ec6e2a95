# Two H200: the session's final main, every device check with one rank per GPU (NCCL loaded):
# gpu_check, gpu_check_coll, gpu_check_lowp --quick, and the Python checks under torchrun.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
for p in gpu_check gpu_check_coll gpu_check_lowp; do
  extra=""; [ $p = gpu_check ] && extra=--no-timing
  timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/$p --quick $extra > $OUT/$p.txt 2>&1
  echo "$p rc=$?: $(tail -1 $OUT/$p.txt)"
done
python3 -m pip install -q --no-deps --no-index --target /tmp/fc-site dist/*.whl > $OUT/pip.txt 2>&1
for p in check_torch check_dynamic check_lists; do
  PYTHONPATH=/tmp/fc-site CHECK_WATCHDOG_S=170 timeout 180 torchrun --nproc_per_node 2 python/tests/gpu/$p.py > $OUT/$p.txt 2>&1
  echo "$p rc=$?"; grep -E "summary|FAIL" $OUT/$p.txt | head -6
done
(cd $OUT && tar czf logs.tgz *.txt && rm -f *.txt)

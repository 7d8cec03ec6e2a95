# The default paths after the copy-engine change (the kernels' Args grew by one word; the copy
# engines off): the three check programs --quick with both ranks on the one GPU (--share-gpus,
# NCCL off), and gpu_check once more with the copy engines from 1 MiB (the large calls only).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=30 FERROCOMM_DEBUG=1
Z=.carry/bin
for p in gpu_check gpu_check_coll gpu_check_lowp; do
  timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/$p --quick --no-timing --share-gpus > $OUT/$p.txt 2>&1
  echo "$p rc=$?: $(grep -E 'all results|passed|FAILED' $OUT/$p.txt | tail -1)"
done
FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1M timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-ce1M.txt 2>&1
echo "gpu_check (copy engines from 1 MiB) rc=$?: $(grep -E 'all results|FAILED' $OUT/gpu_check-ce1M.txt | tail -1)"

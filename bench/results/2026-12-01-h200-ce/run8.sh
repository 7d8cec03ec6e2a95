# gpu_check's new timeout case (a 4 MB flat all-reduce that no other rank joins: the next call
# must name a missing rank after 2 s), by the copy engines and by the SMs, gpu_check --quick with
# both ranks on the one GPU.
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=30 FERROCOMM_DEBUG=1
Z=.carry/bin
for ce in 1 0; do
  FERROCOMM_ALLREDUCE_CE_MIN_BYTES=$ce timeout 250 $Z/ferrocomm launch -n 2 --timeout 248 -- $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-ce$ce.txt 2>&1
  echo "gpu_check (FERROCOMM_ALLREDUCE_CE_MIN_BYTES=$ce) rc=$?: $(grep -E 'all results|FAILED' $OUT/gpu_check-ce$ce.txt | tail -1)"
  grep -E "alone|phase 3" $OUT/gpu_check-ce$ce.txt | head -4
done

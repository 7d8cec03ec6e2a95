# Where the copy-engine all-reduce's large in-place calls wait (FERROCOMM_DEBUG prints a kernel's
# timeout record: peer, phase, block): gpu_check --quick with the copy engines from 1 MiB, 10 s.
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=10 FERROCOMM_DEBUG=1
Z=.carry/bin
FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1M timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-ce.txt 2>&1
echo "rc=$?"; grep -E "timed out|FAIL|matrix done|phase" $OUT/gpu_check-ce.txt | head

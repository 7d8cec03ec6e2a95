# gpu_check in full (every size to 256 MB, 10,000 back-to-back mixed calls, 1,000 graph
# replays) with every flat all-reduce by the copy engines, both ranks on the one GPU.
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=60 FERROCOMM_DEBUG=1
Z=.carry/bin
FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1 timeout 540 $Z/ferrocomm launch -n 2 --timeout 538 -- $Z/gpu_check --no-timing --share-gpus > $OUT/gpu_check-ce-full.txt 2>&1
echo "gpu_check full (copy engines) rc=$?: $(grep -E 'all results|FAILED' $OUT/gpu_check-ce-full.txt | tail -1)"
grep -E "matrix done|race:|graph" $OUT/gpu_check-ce-full.txt | head -5

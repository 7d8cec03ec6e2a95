# One H200, both ranks on the one GPU (--share-gpus, NCCL off: correctness only): gpu_check_coll
# --quick with its new batches step (batch_send_recv at two ranks by direct access: two messages
# each way, sends and receives interleaved, LL and staged sizes, every message its own size).
# Carry [".carry"] holding .carry/one (ferrocomm, gpu_check_coll, the kernels) only.
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/one/kc
Z=.carry/one/bin
timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/gpu_check_coll-2.txt 2>&1
echo "gpu_check_coll 2 ranks rc=$?: $(tail -1 $OUT/gpu_check_coll-2.txt)"
grep -E 'batch|send_recv|FAIL' $OUT/gpu_check_coll-2.txt | head -12

# main at the start of 2026-12-01's second session (3679574 + the session script's `push` part):
# the three check programs --quick with both ranks on the one GPU (--share-gpus, NCCL off), then
# gpu_check once more with push up to its 512 KiB buffer (FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES, the
# setting gpu_session.sh's `push` part times on two GPUs) and with the copy engines at every flat
# size (FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=30 FERROCOMM_DEBUG=1
Z=.carry/bin
{ date -u; nvidia-smi -L; } > $OUT/machine.txt 2>&1
$Z/ferrocomm info > $OUT/info.txt 2>&1
for p in gpu_check gpu_check_coll gpu_check_lowp; do
  timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/$p --quick --no-timing --share-gpus > $OUT/$p.txt 2>&1
  echo "$p rc=$?: $(grep -E 'all results|passed|FAILED' $OUT/$p.txt | tail -1)"
done
FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES=512K timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-push512K.txt 2>&1
echo "gpu_check (push to 512 KiB) rc=$?: $(grep -E 'all results|FAILED' $OUT/gpu_check-push512K.txt | tail -1)"
FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1 timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-ce.txt 2>&1
echo "gpu_check (copy engines at every flat size) rc=$?: $(grep -E 'all results|FAILED' $OUT/gpu_check-ce.txt | tail -1)"

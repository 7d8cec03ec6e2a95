# One H200, both ranks on the one GPU (--share-gpus, NCCL off: correctness only): the copy-engine
# all-reduce with FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1, so every flat all-reduce of the check
# (every dtype and operator, 1 element to 64 MB, odd counts, off-alignment pointers, in and out of
# place, 300 back-to-back mixed calls, graph capture and replay, two communicators, mismatched
# calls) goes through it; then gpu_check --sanitize under compute-sanitizer memcheck and racecheck
# the same way. Pack: scripts/gpu_prepare.sh (carry [".carry"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc FERROCOMM_TIMEOUT_S=30 FERROCOMM_DEBUG=1
Z=.carry/bin
export FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1
$Z/ferrocomm info 2>&1 | grep -i "copy engine" > $OUT/info.txt
cat $OUT/info.txt
timeout 300 $Z/ferrocomm launch -n 2 --timeout 298 -- $Z/gpu_check --quick --no-timing --share-gpus > $OUT/gpu_check-ce.txt 2>&1
echo "gpu_check (copy engine) rc=$?: $(tail -1 $OUT/gpu_check-ce.txt)"
grep -E 'FAIL|wrong|error' $OUT/gpu_check-ce.txt | head -12
FERROCOMM_TIMEOUT_S=120 SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=120 SANITIZE_PROGRAMS="gpu_check" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -3 $OUT/sanitize.txt

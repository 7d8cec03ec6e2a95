# One H200, both ranks on the one GPU (--share-gpus, NCCL off: correctness only): direct
# send/recv at two ranks (a message as the broadcast kernel rooted at its sender).
# gpu_check_coll --quick at 2 ranks (send/recv both ways, every move dtype, sizes 0..64 MB, graph
# capture and back-to-back mixed calls, both ranks sending at once and a longer receive reported)
# and at 3 ranks (point-to-point has no direct path there and NCCL is off, so the program leaves
# it out: the other collectives after the change); its --sanitize mode under
# compute-sanitizer memcheck and racecheck.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/gpu_check_coll-2.txt 2>&1
echo "gpu_check_coll 2 ranks rc=$?: $(tail -1 $OUT/gpu_check_coll-2.txt)"
grep -E 'send_recv|bad_input|mismatch' $OUT/gpu_check_coll-2.txt | head -12
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=200 SANITIZE_PROGRAMS="gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -4 $OUT/sanitize.txt
timeout 100 $Z/ferrocomm launch -n 3 --timeout 98 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/gpu_check_coll-3.txt 2>&1
echo "gpu_check_coll 3 ranks rc=$?: $(tail -1 $OUT/gpu_check_coll-3.txt)"
grep FAIL $OUT/gpu_check_coll-3.txt | head -3

# One H200 (the two-GPU machine was not available): correctness of two candidate builds with both
# ranks on the one GPU (--share-gpus; no timing means anything here):
#   E = branch wip/rs-prefetch 28a2967: gpu_check_coll --quick at 2 ranks (the two-rank LL build)
#   F = branch wip/lp-split 328391e: gpu_check_lowp --quick at 2 ranks (the split push runs at
#       two ranks), then compute-sanitizer memcheck and racecheck over gpu_check_lowp --sanitize.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
E=.carry/bin-E F=.carry/bin-F
timeout 100 $E/ferrocomm launch -n 2 --timeout 98 -- $E/gpu_check_coll --quick --share-gpus > $OUT/coll2-E.txt 2>&1; echo "E coll2 rc=$?"; tail -1 $OUT/coll2-E.txt
timeout 240 $F/ferrocomm launch -n 2 --timeout 238 -- $F/gpu_check_lowp --quick --share-gpus --no-timing > $OUT/lowp2-F.txt 2>&1; echo "F lowp2 rc=$?"; grep -E "FAIL|wrong|passed" $OUT/lowp2-F.txt | tail -4
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=100 SANITIZE_PROGRAMS="gpu_check_lowp" OUT=$OUT bash scripts/gpu_sanitize.sh $F > $OUT/sanitize-F.txt 2>&1; tail -4 $OUT/sanitize-F.txt
(cd $OUT && tar czf logs.tgz $(ls *.txt *.log 2>/dev/null) && rm -f *.log coll*.txt lowp*.txt)

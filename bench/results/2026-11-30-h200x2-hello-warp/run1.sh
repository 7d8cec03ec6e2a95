export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
B=.carry/bin-W
AB_PRECOMPILE=none AB_CHECK=none AB_BENCHES="all_reduce bfloat16" AB_ARGS="-b 1K -e 1M -f 4 -n 20 --reps 3 -G 10 --vs nccl" AB_STEP_S=60 OUT=$OUT bash scripts/gpu_ab.sh .carry/kc .carry/bin-A .carry/bin-N .carry/bin-W .carry/bin-A > /dev/null 2>&1
cp $OUT/ab/summary.txt $OUT/summary-ab.txt; cat $OUT/ab/summary.txt
timeout 120 $B/ferrocomm launch -n 2 --timeout 118 -- $B/gpu_check --quick --no-timing > $OUT/check2.txt 2>&1; echo "check2 rc=$?"; tail -4 $OUT/check2.txt
timeout 150 $B/ferrocomm launch -n 3 --timeout 148 -- $B/gpu_check --share-gpus --quick > $OUT/check3.txt 2>&1; echo "check3 rc=$?"; tail -4 $OUT/check3.txt
SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS=gpu_check OUT=$OUT bash scripts/gpu_sanitize.sh $B > $OUT/sanitize.txt 2>&1; tail -3 $OUT/sanitize.txt

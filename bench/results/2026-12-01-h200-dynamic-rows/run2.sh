# One H200, every rank on the one GPU (--share-gpus, NCCL off: correctness only). run1's checks
# again with the packed form (all_to_all_v_dynamic_packed / device_alltoallv_single) added:
# gpu_check_coll --quick and the Python check at 2 and 3 ranks, gpu_check --quick at 2 ranks
# (the all-reduce kernels, rebuilt with the changed module), compute-sanitizer memcheck and
# racecheck over gpu_check_coll's --sanitize mode at 2 ranks.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
python3 -m pip install -q --no-deps --no-index dist/*.whl > $OUT/pip.txt 2>&1; echo "pip rc=$?"
for n in 2 3; do
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/coll$n.txt 2>&1; echo "coll$n rc=$?"; tail -1 $OUT/coll$n.txt
  grep -E "a2av_dynamic|bad_input|packed fault" $OUT/coll$n.txt | head -8
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- python3 python/tests/gpu/check_dynamic.py --share-gpus > $OUT/py$n.txt 2>&1; echo "py$n rc=$?"; grep -E "summary|FAIL|Error" $OUT/py$n.txt | head -12
done
timeout 120 $Z/ferrocomm launch -n 2 --timeout 118 -- $Z/gpu_check --quick --share-gpus --no-timing > $OUT/check2.txt 2>&1; echo "check2 rc=$?"; tail -1 $OUT/check2.txt
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS="gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -4 $OUT/sanitize.txt

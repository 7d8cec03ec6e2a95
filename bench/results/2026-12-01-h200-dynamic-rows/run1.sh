# One H200, every rank on the one GPU (--share-gpus, NCCL off: correctness only). The device-count
# all-to-all-v with counts of rows (DeviceCounts::unit) and its Python method:
# gpu_check_coll --quick at 2 and 3 ranks, the Python check (torch counts made on the device,
# graph capture, overfull parts, errors) at 2 and 3 ranks, compute-sanitizer memcheck and
# racecheck over gpu_check_coll's --sanitize mode at 2 ranks.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
python3 -m pip install -q --no-deps --no-index dist/*.whl > $OUT/pip.txt 2>&1; echo "pip rc=$?"
for n in 2 3; do
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/coll$n.txt 2>&1; echo "coll$n rc=$?"; tail -2 $OUT/coll$n.txt
  grep -c "dynamic" $OUT/coll$n.txt
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- python3 python/tests/gpu/check_dynamic.py --share-gpus > $OUT/py$n.txt 2>&1; echo "py$n rc=$?"; grep -E "summary|FAIL|Error" $OUT/py$n.txt | head -12
done
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=150 SANITIZE_PROGRAMS="gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -4 $OUT/sanitize.txt

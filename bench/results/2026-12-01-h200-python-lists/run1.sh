# One H200, every rank on the one GPU (--share-gpus, NCCL off: correctness only): the Python
# check of torchcomms' list methods (all_gather_v, gather, scatter, reduce_scatter_v) at 2 and
# 3 ranks, and the device-count check again (the same wheel).
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
python3 -m pip install -q --no-deps --no-index dist/*.whl > $OUT/pip.txt 2>&1; echo "pip rc=$?"
for n in 2 3; do
  timeout 200 $Z/ferrocomm launch -n $n --timeout 198 -- python3 python/tests/gpu/check_lists.py --share-gpus > $OUT/lists$n.txt 2>&1; echo "lists$n rc=$?"; grep -E "summary|FAIL|Error" $OUT/lists$n.txt | head -12
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- python3 python/tests/gpu/check_dynamic.py --share-gpus > $OUT/dyn$n.txt 2>&1; echo "dyn$n rc=$?"; grep -E "summary|FAIL" $OUT/dyn$n.txt | head -6
done

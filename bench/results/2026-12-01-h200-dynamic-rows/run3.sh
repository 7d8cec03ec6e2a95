# One H200 again, after the review (the cuda backend's two device-count calls share one path,
# the Python check's graph helpers): gpu_check_coll --quick and the Python check at 2 and 3
# ranks sharing the GPU (correctness only), then the bench's new device_alltoallv row at one
# rank (its counts in device memory, its check) beside all_to_all_v, NCCL in the same run.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
python3 -m pip install -q --no-deps --no-index dist/*.whl > $OUT/pip.txt 2>&1; echo "pip rc=$?"
for n in 2 3; do
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- $Z/gpu_check_coll --quick --share-gpus > $OUT/coll$n.txt 2>&1; echo "coll$n rc=$?"; tail -1 $OUT/coll$n.txt
  grep -E "a2av_dynamic|bad_input" $OUT/coll$n.txt | head -5
  timeout 150 $Z/ferrocomm launch -n $n --timeout 148 -- python3 python/tests/gpu/check_dynamic.py --share-gpus > $OUT/py$n.txt 2>&1; echo "py$n rc=$?"; grep -E "summary|FAIL|Error" $OUT/py$n.txt | head -12
done
for c in device_alltoallv all_to_all_v; do
  timeout 120 $Z/ferrocomm bench $c -g 1 -d bfloat16 -b 1K -e 16M -f 4 -n 10 --reps 2 -G 10 --vs nccl > $OUT/bench-$c.txt 2>&1; echo "bench $c rc=$?"; grep -v "^#  Rank" $OUT/bench-$c.txt | tail -16
done

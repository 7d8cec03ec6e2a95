# Two H200 after the review commit (one count-upload helper in gpu_check_coll, one reference
# for both device-count layouts in check_dynamic.py): gpu_check_coll --quick and the Python
# device-count check, one rank per GPU.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
timeout 100 $Z/ferrocomm launch -n 2 --timeout 98 -- $Z/gpu_check_coll --quick > $OUT/coll.txt 2>&1; echo "gpu_check_coll rc=$?: $(tail -1 $OUT/coll.txt)"
grep -E "a2av_dynamic" $OUT/coll.txt | head -4
python3 -m pip install -q --no-deps --no-index --target /tmp/fc-site dist/*.whl > $OUT/pip.txt 2>&1
PYTHONPATH=/tmp/fc-site timeout 120 torchrun --nproc_per_node 2 python/tests/gpu/check_dynamic.py > $OUT/dyn.txt 2>&1
echo "check_dynamic rc=$?"; grep -E "summary|FAIL" $OUT/dyn.txt | head -4

# For 2xH200 (not run yet): the device-count all-to-all-v against NCCL's all-to-all-v with the
# same uneven parts, beside our host-count all-to-all-v, graph mode; then the Python checks of
# the device-count calls and the list methods with one rank per GPU (torchrun).
# Pack: scripts/gpu_prepare.sh on main (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
for c in device_alltoallv all_to_all_v; do
  timeout 150 $Z/ferrocomm bench $c -g 2 -d bfloat16 -b 1K -e 64M -f 4 -n 10 --reps 2 -G 10 --vs nccl \
    --json $OUT/$c.json > $OUT/$c.txt 2>&1; echo "$c rc=$?"; grep -v "^#  Rank" $OUT/$c.txt | tail -16
done
python3 -m pip install -q --no-deps --no-index --target /tmp/fc-site dist/*.whl > $OUT/pip.txt 2>&1
for p in check_dynamic check_lists; do
  PYTHONPATH=/tmp/fc-site timeout 150 torchrun --nproc_per_node 2 python/tests/gpu/$p.py > $OUT/$p.txt 2>&1
  echo "$p rc=$?"; grep -E "summary|FAIL" $OUT/$p.txt | head -8
done
# And the whole Python API against torch.distributed on two GPUs (the batch of sends and
# receives included: one NCCL group).
PYTHONPATH=/tmp/fc-site CHECK_WATCHDOG_S=170 timeout 180 torchrun --nproc_per_node 2 python/tests/gpu/check_torch.py > $OUT/check_torch.txt 2>&1
echo "check_torch rc=$?"; grep -E "summary|FAIL" $OUT/check_torch.txt | head -12

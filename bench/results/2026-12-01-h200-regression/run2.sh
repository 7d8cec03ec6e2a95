# One H200, after the batch of sends and receives (NCCL's grouped point-to-point now built from
# per-operation records, exchange_ops): the NCCL path of the all-to-all-v at one rank (sends to
# and receives from itself in one group), forced (--algo nccl: our column is NCCL, checked) and
# beside ours (--vs nccl); gpu_check_coll --quick at one rank (NCCL loaded); the device checks
# at 2 ranks sharing the GPU; the Python checks at 2 ranks.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
for a in algo vs; do
  timeout 100 $Z/ferrocomm bench all_to_all_v -g 1 -d bfloat16 -b 1K -e 64M -f 8 -n 5 --reps 1 --$a nccl > $OUT/a2av-$a-nccl.txt 2>&1
  echo "all_to_all_v --$a nccl rc=$?"; grep -v "^#  Rank" $OUT/a2av-$a-nccl.txt | tail -11
done
timeout 100 $Z/ferrocomm launch -n 1 --timeout 98 -- $Z/gpu_check_coll --quick > $OUT/coll1.txt 2>&1; echo "coll1 rc=$?: $(tail -1 $OUT/coll1.txt)"
for p in gpu_check_coll gpu_check; do
  extra=""; [ $p = gpu_check ] && extra=--no-timing
  timeout 200 $Z/ferrocomm launch -n 2 --timeout 198 -- $Z/$p --quick --share-gpus $extra > $OUT/$p-2.txt 2>&1
  echo "$p 2 ranks rc=$?: $(tail -1 $OUT/$p-2.txt)"
done
python3 -m pip install -q --no-deps --no-index dist/*.whl > $OUT/pip.txt 2>&1
for p in check_dynamic check_lists; do
  timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- python3 python/tests/gpu/$p.py --share-gpus > $OUT/$p.txt 2>&1; echo "$p rc=$?"; grep -E "summary|FAIL" $OUT/$p.txt | head -4
done

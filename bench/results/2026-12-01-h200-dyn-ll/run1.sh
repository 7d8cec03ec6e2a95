# One H200, ranks sharing the one GPU (--share-gpus, NCCL off: correctness only): the
# device-count all-to-all-v with each pair's protocol chosen by the count its sender announces
# (LL lines after a count header up to the LL limit, the staging above; packed verdicts as LL
# lines). gpu_check_coll (full: dynamic rounds with parts on both sides of the limit in one call,
# packed rounds, faults of both layouts) at 2 and 3 ranks, its --sanitize mode under
# compute-sanitizer memcheck and racecheck at 2 ranks, and check_dynamic.py at 2 ranks.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
for n in 2 3; do
  timeout 200 $Z/ferrocomm launch -n $n --timeout 198 -- $Z/gpu_check_coll --share-gpus > $OUT/gpu_check_coll-$n.txt 2>&1
  echo "gpu_check_coll $n ranks rc=$?: $(tail -1 $OUT/gpu_check_coll-$n.txt)"
  grep -E 'a2av_dynamic|FAIL' $OUT/gpu_check_coll-$n.txt | head -8
done
SANITIZE_WORLD=2 SANITIZE_FLAGS=--share-gpus SANITIZE_RUN_TIMEOUT_S=200 SANITIZE_PROGRAMS="gpu_check_coll" OUT=$OUT bash scripts/gpu_sanitize.sh $Z > $OUT/sanitize.txt 2>&1; tail -3 $OUT/sanitize.txt
python3 -m pip install -q --no-deps --no-index --target /tmp/fc-site dist/*.whl > $OUT/pip.txt 2>&1
PYTHONPATH=/tmp/fc-site timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- python3 python/tests/gpu/check_dynamic.py --share-gpus > $OUT/check_dynamic.txt 2>&1; echo "check_dynamic rc=$?"; grep -E "summary|FAIL|passed" $OUT/check_dynamic.txt | head -4

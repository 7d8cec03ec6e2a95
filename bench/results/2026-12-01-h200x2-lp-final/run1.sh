# Two H200: main with the split push (72d59ca and later): its checks on two GPUs, then the
# low-precision table (README, docs/quant-accuracy.md) against NCCL's full precision, 4-64 MB
# checked and 256 MB unchecked (-c 0: the bench's host check of 128 M elements outlasts the
# step; gpu_check_lowp covers the chunked calls).
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
timeout 60 $Z/ferrocomm launch -n 2 --timeout 58 -- $Z/gpu_check_lowp --quick > $OUT/lowp.txt 2>&1; echo "gpu_check_lowp rc=$?: $(tail -1 $OUT/lowp.txt)"
timeout 60 $Z/ferrocomm launch -n 2 --timeout 58 -- $Z/gpu_check_coll --quick > $OUT/coll.txt 2>&1; echo "gpu_check_coll rc=$?: $(tail -1 $OUT/coll.txt)"
for c in "all_reduce bfloat16" "all_reduce float" "all_gather bfloat16" "all_to_all bfloat16"; do
  set -- $c
  timeout 40 $Z/ferrocomm bench $1 -g 2 -d $2 -b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl > $OUT/$1-$2.txt 2>&1
  echo "== $1 $2 rc=$?"; grep -E '^ +[0-9]' $OUT/$1-$2.txt | cut -c1-175
  timeout 40 $Z/ferrocomm bench $1 -g 2 -d $2 -b 256M -e 256M -n 5 --reps 2 -G 10 -c 0 --low-precision e4m3 --vs nccl > $OUT/$1-$2-256M.txt 2>&1
  echo "== $1 $2 256M rc=$?"; grep -E '^ +[0-9]' $OUT/$1-$2-256M.txt | cut -c1-175
done

# Two H200: the low-precision all-to-all-v row of the README on the final main (the split push
# takes the two-rank all-to-all kernel's parts too), 4-64 MB checked, 256 MB unchecked.
# Pack: scripts/gpu_prepare.sh (carry [".carry", "dist"]).
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin
timeout 60 $Z/ferrocomm bench all_to_all_v -g 2 -d bfloat16 -b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl > $OUT/a2av.txt 2>&1
echo "a2av rc=$?"; grep -E '^ +[0-9]' $OUT/a2av.txt | cut -c1-175
timeout 60 $Z/ferrocomm bench all_to_all_v -g 2 -d bfloat16 -b 256M -e 256M -n 5 --reps 2 -G 10 -c 0 --low-precision e4m3 --vs nccl > $OUT/a2av-256M.txt 2>&1
echo "a2av 256M rc=$?"; grep -E '^ +[0-9]' $OUT/a2av-256M.txt | cut -c1-175

# Z = main 631908f (the pack of ../2026-11-30-h200x2-push-fold run2), first run on 4 GPUs
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
Z=.carry/bin-Z
nvidia-smi topo -m > $OUT/topo.txt 2>&1
timeout 45 $Z/ferrocomm bench all_reduce -g 4 -d bfloat16 -b 1K -e 16M -f 4 -n 10 --reps 2 -G 10 --vs nccl > $OUT/all_reduce.txt 2>&1; echo "bench all_reduce rc=$?"
timeout 40 $Z/ferrocomm bench all_to_all_v -g 4 -d bfloat16 -b 1K -e 16M -f 4 -n 10 --reps 2 -G 10 --vs nccl > $OUT/all_to_all_v.txt 2>&1; echo "bench a2av rc=$?"
timeout 60 $Z/ferrocomm launch -n 4 --timeout 58 -- $Z/gpu_check --quick --no-timing > $OUT/check4.txt 2>&1; echo "gpu_check 4 rc=$?"; tail -1 $OUT/check4.txt
for c in all_reduce all_to_all_v; do echo "== $c"; grep -E '^ +[0-9]' $OUT/$c.txt | awk '{print $1, $6, $9, $14, $15, $16}'; done

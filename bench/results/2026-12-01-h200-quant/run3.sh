# One H200: S = the quantizer's shared-memory stores at an address taken once (st.shared through
# the address cvta gives once per call; through the generic pointer the compiler rebuilt the
# shared window's base, S2R SR_CgaCtaId and three more, for every store: 24 such reads in the
# encode kernel, 1 now), against C (main 44c4378) and Q2 (main ac7b72e): quantization alone,
# each twice, alternating; S's gpu_check_lowp --quick at 2 ranks sharing the GPU; then (a second
# call) compute-sanitizer over S's gpu_check_lowp --sanitize.
tar xzf .carry/pack.tgz -C .carry
export NCCL_NVLS_ENABLE=0 FERROCOMM_KERNEL_CACHE=$PWD/.carry/kc
for r in 1 2; do for v in C Q2 S; do Z=.carry/bin-$v; echo -n "$v: "; timeout 100 $Z/ferrocomm launch -n 1 -- $Z/gpu_check_lowp --quant-time 2>&1 | grep -E "quantize alone|passed" | sed 's/\[rank 0\] //' | tr '\n' ' '; echo; done; done
Z=.carry/bin-S; timeout 150 $Z/ferrocomm launch -n 2 --timeout 148 -- $Z/gpu_check_lowp --quick --share-gpus --no-timing > $OUT/lowp2-S.txt 2>&1; echo "S lowp2 rc=$?"; grep -E "failed" $OUT/lowp2-S.txt | tail -1

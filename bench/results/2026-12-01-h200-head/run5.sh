# After the LL128 all-reduce's NVLink check (NVML, each rank for its peers, agreed at set-up):
# `ferrocomm info` whole (its NVML line), then run2.sh again: ranks sharing the one GPU count as
# linked, so the LL128 cases must still run (the lone rank's record: phase 33).
FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M .carry/bin/ferrocomm info > $OUT/info-full.txt 2>&1
grep -E "NVML|LL128" $OUT/info-full.txt
bash bench/results/2026-12-01-h200-head/run2.sh
grep -h "phase 33\|stays off" $OUT/gpu_check-ll128-n*.txt | head -4

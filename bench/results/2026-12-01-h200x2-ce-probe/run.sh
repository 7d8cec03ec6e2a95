#!/usr/bin/env bash
# bash run.sh [SIZES...]: builds ce_probe.cu on the device and runs it (2 GPUs); output in $OUT.
set -u
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0
NVCC=$(which nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O2 -arch=sm_90 -o /tmp/ce_probe ce_probe.cu 2>&1 | grep -iE "error|warning" | head -5
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/ce_probe-machine.txt" 2>&1
timeout 300 /tmp/ce_probe "$@" 2>&1 | tee "$OUT/ce_probe.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> "$OUT/ce_probe.txt"

#!/usr/bin/env bash
set -u
cd "$(dirname "$0")"
NVCC=$(which nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O2 -arch=sm_90 -o /tmp/ce_probe ce_probe.cu 2>&1 | tail -5
timeout 240 /tmp/ce_probe 2>&1 | tee $OUT/ce_probe.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $OUT/ce_probe.txt

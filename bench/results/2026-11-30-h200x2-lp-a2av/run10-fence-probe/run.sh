#!/usr/bin/env bash
set -u
cd "$(dirname "$0")"
which nvcc || ls /usr/local/cuda*/bin/nvcc
NVCC=$(which nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O2 -arch=sm_90 -o /tmp/fence_probe fence_probe.cu 2>&1 | tail -5
/tmp/fence_probe | tee $OUT/fence_probe.txt
nvidia-smi --query-gpu=name --format=csv >> $OUT/fence_probe.txt

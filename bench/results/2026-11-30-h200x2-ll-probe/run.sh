#!/usr/bin/env bash
# bash run.sh [ll] [lib]: builds and runs the named probes (both by default).
set -u
cd "$(dirname "$0")"
NVCC=$(which nvcc || echo /usr/local/cuda/bin/nvcc)
for p in ${@:-ll lib}; do
  $NVCC -O2 -arch=sm_90 -o /tmp/${p}_probe ${p}_probe.cu 2>&1 | grep -i "error" | head -5
  timeout 240 /tmp/${p}_probe 2>&1 | tee $OUT/${p}_probe.txt
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $OUT/${p}_probe.txt

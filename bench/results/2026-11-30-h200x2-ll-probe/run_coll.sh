#!/usr/bin/env bash
# bash run_coll.sh: coll_probe.cu built against the working tree's collectives.cu ("new") and
# against collectives-old.cu (`git show abed616:crates/ferrocomm/kernels/collectives.cu`, put here
# before the run; not kept), run old/new/old/new.
set -u
cd "$(dirname "$0")"
NVCC=$(which nvcc || echo /usr/local/cuda/bin/nvcc)
$NVCC -O2 -arch=sm_90 -DCOLLECTIVES='"collectives-old.cu"' -I../../../crates/ferrocomm/kernels -o /tmp/coll_old coll_probe.cu 2>&1 | grep -i " error" | head -5 &
$NVCC -O2 -arch=sm_90 -DCOLLECTIVES='"../../../crates/ferrocomm/kernels/collectives.cu"' -o /tmp/coll_new coll_probe.cu 2>&1 | grep -i " error" | head -5 &
wait
for v in old new old new; do echo "== $v"; timeout 100 /tmp/coll_$v; done 2>&1 | tee $OUT/coll_probe.txt

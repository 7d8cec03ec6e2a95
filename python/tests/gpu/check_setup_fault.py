"""GPU check: direct access that fails to set up on one rank only.

    torchrun --nproc_per_node 2 python/tests/gpu/check_setup_fault.py

Every rank asks for the same 4 GiB IPC staging (FERROCOMM_CUDA_STAGING_BYTES: the settings the
ranks share must agree), and the last rank first fills its GPU with a tensor that leaves 2 GiB
free, so its staging allocation (8 GiB: two parities) fails while the other ranks' succeed.
Every rank must then agree: the communicator comes up on every rank with direct access off
(NCCL carries it), forcing a direct-access algorithm is refused on every rank with the failing
rank's reason, and the collectives still match torch.distributed. Before the ranks agreed, the
healthy ranks kept direct access and their kernels waited for a rank that would never join them.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEV = torch.device("cuda", int(os.environ.get("LOCAL_RANK", RANK)))
# Bounded: whatever happens, no step below waits longer than this.
os.environ.setdefault("FERROCOMM_TIMEOUT_S", "20")
os.environ["FERROCOMM_CUDA_STAGING_BYTES"] = str(4 << 30)
LEAVE_FREE = 2 << 30  # room for NCCL's buffers, not for the 8 GiB staging

import ferrocomm  # noqa: E402  (after the environment it reads)
from ferrocomm import ReduceOp  # noqa: E402


def main():
    torch.cuda.set_device(DEV)
    dist.init_process_group("nccl", device_id=DEV)
    fails = []
    hog = None
    if RANK == WORLD - 1:
        free, _ = torch.cuda.mem_get_info(DEV)
        hog = torch.empty(free - LEAVE_FREE, dtype=torch.uint8, device=DEV)
    t0 = time.time()
    comm = ferrocomm.new_comm("ferrocomm", "cuda", "setup-fault")
    up = time.time() - t0
    algo = comm.algo_for("all_reduce", 4096, torch.float32)
    if algo != "nccl":
        fails.append(f"rank {RANK}: all_reduce of 4 KiB would run {algo}, expected nccl")
    try:
        comm.all_reduce(torch.ones(1024, device=DEV), ReduceOp.SUM, hints={"algo": "flat"})
        torch.cuda.synchronize()
        fails.append(f"rank {RANK}: a forced flat all-reduce ran without direct access")
    except ferrocomm.FerrocommError as e:
        reason = str(e)
        if f"rank {WORLD - 1}" not in reason or "cuMemAlloc" not in reason:
            fails.append(f"rank {RANK}: refusal does not name rank {WORLD - 1}'s failure: {reason}")
        if RANK == 0:
            print(f"forced flat refused: {reason}", flush=True)
    g = torch.Generator(device=DEV).manual_seed(7 + RANK)
    for n in (1, 4099, 1 << 20):
        x = torch.randn(n, device=DEV, generator=g)
        want = x.clone()
        dist.all_reduce(want)
        comm.all_reduce(x, ReduceOp.SUM)
        if not torch.allclose(x, want, rtol=1e-6, atol=1e-6):
            fails.append(f"rank {RANK}: all_reduce n={n} differs from torch.distributed")
        y = torch.empty(n * WORLD, device=DEV)
        yw = torch.empty_like(y)
        comm.all_gather_single(y, x)
        dist.all_gather_into_tensor(yw, x)
        if not torch.equal(y, yw):
            fails.append(f"rank {RANK}: all_gather_single n={n} differs from torch.distributed")
    torch.cuda.synchronize()
    comm.finalize()
    del hog
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, fails)
    bad = [f for r in everyone for f in r]
    if RANK == 0:
        print(f"communicator up in {up:.2f} s on rank 0 with algo_for(all_reduce, 4 KiB) = {algo}")
        for f in bad:
            print("FAIL", f)
        print(f"setup-fault check: {'FAILED' if bad else 'passed'} ({WORLD} ranks)", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

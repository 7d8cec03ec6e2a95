"""What the Python GPU checks that run with ranks sharing a GPU have in common: the rank and
device from the launcher's environment (``--share-gpus``: GPU ``LOCAL_RANK mod count``, NCCL
not loaded, since it refuses two ranks on one GPU), the tally, byte comparison, argument-error
cases and the summary."""

import os
import sys

import torch

import ferrocomm

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
SHARE = "--share-gpus" in sys.argv[1:]
if SHARE:
    os.environ["FERROCOMM_NCCL_LIB"] = "(no NCCL: ranks share GPUs)"
DEV = torch.device("cuda", LOCAL % torch.cuda.device_count() if SHARE else LOCAL)
FAILURES = []
PASSED = [0]


def record(name, ok, detail=""):
    if ok:
        PASSED[0] += 1
    else:
        FAILURES.append(f"{name}: {detail}")
        print(f"[rank {RANK}] FAIL {name} {detail}", flush=True)


def poison(t):
    t.view(torch.uint8).fill_(0x7E)
    return t


def same_bytes(a, b):
    torch.cuda.synchronize(DEV)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def captured(body):
    """`body` run once on a side stream (warm-up: kernels loaded, buffers mapped), then
    captured in a CUDA graph."""
    s = torch.cuda.Stream(DEV)
    s.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream(DEV).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def expect_errors(cases):
    """Each (needle, call) must raise FerrocommValueError whose message holds the needle."""
    for needle, f in cases:
        try:
            f()
            record(f"error: {needle}", False, "no error")
        except ferrocomm.FerrocommValueError as e:
            record(f"error: {needle}", needle in str(e), str(e))


def finish(comm):
    """Finalizes `comm`, prints the summary and exits 1 on any failure."""
    comm.finalize()
    print(f"[rank {RANK}] summary: {PASSED[0]} passed, {len(FAILURES)} failed", flush=True)
    sys.exit(1 if FAILURES else 0)

"""GPU check of torchcomms' uneven and rooted list methods: ``all_gather_v``, ``gather``,
``scatter`` and ``reduce_scatter_v``, on CUDA tensors.

    ferrocomm launch -n 2 -- python3 python/tests/gpu/check_lists.py [--share-gpus]

(torchrun works too; ``--share-gpus`` as in check_dynamic.py: every rank on GPU ``LOCAL_RANK
mod count``, NCCL not loaded, correctness only.) Every rank builds every rank's inputs from the
same seeds and checks its results against a reference of its own, computed in float64 for the
reductions: parts of different sizes (odd ones included), several dtypes, every root, async
work, a CUDA graph, and the errors for bad lists. Outputs are poisoned before every call.
Prints a summary; exits 1 on any mismatch.
"""

import torch

import ferrocomm
from ferrocomm import ReduceOp
from shared_check import (
    DEV, RANK, WORLD, captured, expect_errors, finish, poison, record, same_bytes,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8,
          torch.float8_e4m3fn]


def rand(n, dtype, seed, owner):
    """Rank `owner`'s data for `seed`: the same on every rank that makes it."""
    g = torch.Generator(device=DEV).manual_seed(seed * 7919 + owner)
    if dtype.is_floating_point:
        return (torch.randn(n, device=DEV, generator=g) * 3).to(dtype)
    hi = 9 if dtype == torch.uint8 else 1000
    return torch.randint(0, hi, (n,), device=DEV, generator=g).to(dtype)


def sizes(base):
    return [base + 3 * r + (r % 2) for r in range(WORLD)]


def check_gathers(comm):
    for k, dtype in enumerate(DTYPES):
        for base in (1, 1000, 70001):
            seed = 100 * k + base % 97
            sz = sizes(base)
            mine = rand(sz[RANK], dtype, seed, RANK)
            outs = [poison(torch.empty(sz[r], dtype=dtype, device=DEV)) for r in range(WORLD)]
            comm.all_gather_v(outs, mine)
            ok = all(same_bytes(outs[r], rand(sz[r], dtype, seed, r)) for r in range(WORLD))
            record(f"all_gather_v {str(dtype)[6:]} base {base}", ok)
            for root in range(WORLD):
                got = [poison(torch.empty(sz[r], dtype=dtype, device=DEV))
                       for r in range(WORLD)] if RANK == root else None
                comm.gather(got, mine, root)
                ok = RANK != root or all(
                    same_bytes(got[r], rand(sz[r], dtype, seed, r)) for r in range(WORLD))
                record(f"gather {str(dtype)[6:]} base {base} to {root}", ok)
                parts = [rand(sz[p], dtype, seed + 1 + p, root) for p in range(WORLD)]
                out = poison(torch.empty(sz[RANK], dtype=dtype, device=DEV))
                comm.scatter(out, parts if RANK == root else None, root)
                record(f"scatter {str(dtype)[6:]} base {base} from {root}",
                       same_bytes(out, parts[RANK]))


def check_reduce_scatter_v(comm):
    for k, dtype in enumerate([torch.float32, torch.bfloat16, torch.int32]):
        for base in (1, 4099, 300001):
            seed = 500 + 10 * k + base % 7
            sz = sizes(base)
            lists = [[rand(sz[p], dtype, seed + p, r) for p in range(WORLD)] for r in range(WORLD)]
            for op, name in ((ReduceOp.SUM, "sum"), (ReduceOp.MAX, "max")):
                out = poison(torch.empty(sz[RANK], dtype=dtype, device=DEV))
                comm.reduce_scatter_v(out, lists[RANK], op)
                torch.cuda.synchronize(DEV)
                parts = torch.stack([lists[r][RANK].double() for r in range(WORLD)])
                want = parts.sum(0) if name == "sum" else parts.max(0).values
                err = (out.double() - want).abs().max().item()
                tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}.get(dtype, 0) * WORLD
                scale = max(1.0, want.abs().max().item())
                record(f"reduce_scatter_v {name} {str(dtype)[6:]} base {base}",
                       err <= tol * scale * 4, f"max abs error {err}")


def check_async_and_graph(comm):
    sz = sizes(513)
    mine = rand(sz[RANK], torch.float32, 900, RANK)
    outs = [poison(torch.empty(sz[r], device=DEV)) for r in range(WORLD)]
    work = comm.all_gather_v(outs, mine, async_op=True)
    work.wait()
    ok = all(same_bytes(outs[r], rand(sz[r], torch.float32, 900, r)) for r in range(WORLD))
    record("all_gather_v async", ok)
    # One graph of a gather and a scatter, replayed with new inputs copied in.
    src = torch.empty(sz[RANK], device=DEV)
    parts = [torch.empty(sz[p], device=DEV) for p in range(WORLD)]
    got = [torch.empty(sz[r], device=DEV) for r in range(WORLD)]
    out = torch.empty(sz[RANK], device=DEV)
    root = WORLD - 1

    def body():
        comm.gather(got, src, root)
        comm.scatter(out, parts, root)

    graph = captured(body)
    errs = []
    for it in range(3):
        seed = 910 + it
        src.copy_(rand(sz[RANK], torch.float32, seed, RANK))
        for p in range(WORLD):
            parts[p].copy_(rand(sz[p], torch.float32, seed + 50 + p, root))
        for t in got + [out]:
            poison(t)
        graph.replay()
        ok = same_bytes(out, rand(sz[RANK], torch.float32, seed + 50 + RANK, root))
        if RANK == root:
            ok = ok and all(same_bytes(got[r], rand(sz[r], torch.float32, seed, r))
                            for r in range(WORLD))
        if not ok:
            errs.append(f"replay {it}")
    record("gather and scatter in a CUDA graph", not errs, "; ".join(errs))


def check_errors(comm):
    t = torch.ones(4, device=DEV)
    cases = [
        ("out of range", lambda: comm.gather(None, t, WORLD)),
        ("expected one per rank", lambda: comm.all_gather_v([t], t)),
        ("dtype mismatch", lambda: comm.all_gather_v(
            [torch.empty(4, device=DEV, dtype=torch.float64) for _ in range(WORLD)], t)),
        ("is on cpu", lambda: comm.scatter(t, [torch.ones(4) for _ in range(WORLD)], RANK)),
    ]
    expect_errors(cases)


def main():
    torch.cuda.set_device(DEV)
    comm = ferrocomm.new_comm("ferrocomm", DEV, "check-lists")
    check_gathers(comm)
    check_reduce_scatter_v(comm)
    check_async_and_graph(comm)
    check_errors(comm)
    finish(comm)


if __name__ == "__main__":
    main()

"""GPU check of ``Comm.all_to_all_v_dynamic`` and ``Comm.device_alltoallv_single``:
mixture-of-experts dispatch with the counts made on the device by torch ops, never read by the
host before the call.

    ferrocomm launch -n 2 -- python3 python/tests/gpu/check_dynamic.py [--share-gpus]

(torchrun works too.) With ``--share-gpus`` every rank runs on GPU ``LOCAL_RANK mod count`` and
NCCL is not loaded (it refuses two ranks on one GPU), so two ranks can run on one GPU
(correctness only). Every rank builds every rank's tokens from the same seeds, so it checks
its rows and received counts against a reference of its own: rows of several dtypes and
lengths (byte lengths that are no multiple of 16), int32 and int64 counts, zero counts, CUDA
graph capture with the routing changing between replays, async work, a part longer than the
capacity (cut, reported by the next call); the packed form with the counts exchanged on the
device, in a graph too, and two faults one rank makes (reported on every rank). Outputs are
poisoned before every call. Prints a summary; exits 1 on any mismatch.
"""

import torch

import ferrocomm
from shared_check import (
    DEV, RANK, WORLD, captured, expect_errors, finish, poison, record, same_bytes,
)


def tokens(sender, seed, rows, hidden, dtype):
    """Rank `sender`'s tokens sorted by destination rank, and each token's destination."""
    g = torch.Generator(device=DEV).manual_seed(seed * 1009 + sender)
    dest = torch.randint(0, WORLD, (rows,), generator=g, device=DEV)
    if seed % 3 == 0:
        dest[dest == (sender + 1) % WORLD] = sender  # one destination gets nothing
    x = torch.randn(rows, hidden, generator=g, device=DEV) * 4
    order = torch.argsort(dest, stable=True)
    return x[order].to(dtype).contiguous(), dest[order].contiguous()


def counts_of(dest, cdt):
    """Tokens per destination, computed on the device (capturable, no host sync)."""
    ranks = torch.arange(WORLD, device=DEV)
    return (dest.unsqueeze(1) == ranks).sum(0).to(cdt)


def expected(seed, rows_of, hidden, dtype, cap, out):
    """The output rank RANK must hold (poison where nothing arrives) and its counts: the rows
    from rank s at row s * cap, cut to `cap`; with `cap` None packed one after another."""
    want = poison(torch.empty_like(out))
    wb = want.view(torch.uint8)  # bytes: boolean indexing has no fp8 kernels
    at, got = 0, []
    for s in range(WORLD):
        x, dest = tokens(s, seed, rows_of(s), hidden, dtype)
        mine = x.view(torch.uint8)[dest == RANK]
        n = mine.shape[0] if cap is None else min(mine.shape[0], cap)
        start = at if cap is None else s * cap
        wb[start:start + n] = mine[:n]
        at += n
        got.append(mine.shape[0])
    return want, got


def check_dispatch(comm):
    cases = [
        (torch.bfloat16, 7, torch.int64, 1000),   # 14-byte rows
        (torch.float32, 64, torch.int32, 333),
        (torch.float8_e4m3fn, 5, torch.int64, 2500),  # 5-byte rows
        (torch.float16, 128, torch.int32, 1),
        (torch.bfloat16, 4096, torch.int64, 64),  # a token of a hidden size 4096 model
    ]
    for k, (dtype, hidden, cdt, base) in enumerate(cases):
        seed = 10 + k
        rows_of = lambda s, base=base: base + 37 * s  # noqa: E731
        cap = max(rows_of(s) for s in range(WORLD))
        x, dest = tokens(RANK, seed, rows_of(RANK), hidden, dtype)
        send = counts_of(dest, cdt)
        recv = torch.full((WORLD,), -5, dtype=cdt, device=DEV)
        out = poison(torch.empty(WORLD * cap, hidden, dtype=dtype, device=DEV))
        comm.all_to_all_v_dynamic(out, x, send, recv)
        want, got = expected(seed, rows_of, hidden, dtype, cap, out)
        torch.cuda.synchronize(DEV)
        name = f"dispatch {str(dtype)[6:]} rows of {hidden}, {str(cdt)[6:]} counts"
        record(name + " rows", same_bytes(out, want))
        record(name + " counts", recv.tolist() == got, f"{recv.tolist()} != {got}")


def check_async(comm):
    dtype, hidden = torch.bfloat16, 96
    rows_of = lambda s: 700 + 11 * s  # noqa: E731
    cap = 800
    x, dest = tokens(RANK, 40, rows_of(RANK), hidden, dtype)
    recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    out = poison(torch.empty(WORLD * cap, hidden, dtype=dtype, device=DEV))
    work = comm.all_to_all_v_dynamic(out, x, counts_of(dest, torch.int64), recv, async_op=True)
    work.wait()
    want, got = expected(40, rows_of, hidden, dtype, cap, out)
    torch.cuda.synchronize(DEV)
    record("async dispatch", same_bytes(out, want) and recv.tolist() == got)


def replays(graph, bufs, shape, seeds, expect):
    """Replays `graph` once per seed with that seed's tokens in `bufs` = (tokens, destinations,
    output, receive counts); `expect(seed)` gives the output and counts wanted. Returns the
    replays that went wrong."""
    xs, dst, out, recv = bufs
    rows, hidden, dtype = shape
    errs = []
    for it, seed in enumerate(seeds):
        x, d = tokens(RANK, seed, rows, hidden, dtype)
        xs.copy_(x)
        dst.copy_(d)
        poison(out)
        recv.fill_(-1)
        graph.replay()
        want, got = expect(seed)
        torch.cuda.synchronize(DEV)
        if not (same_bytes(out, want) and recv.tolist() == got):
            errs.append(f"replay {it}: counts {recv.tolist()} want {got}")
    return errs


def check_graph(comm):
    """Counts and dispatch captured once; each replay routes new tokens."""
    dtype, hidden, rows = torch.bfloat16, 48, 900
    cap = rows
    xs = torch.empty(rows, hidden, dtype=dtype, device=DEV)
    dst = torch.empty(rows, dtype=torch.int64, device=DEV)
    recv = torch.empty(WORLD, dtype=torch.int32, device=DEV)
    out = torch.empty(WORLD * cap, hidden, dtype=dtype, device=DEV)
    x0, d0 = tokens(RANK, 50, rows, hidden, dtype)
    xs.copy_(x0)
    dst.copy_(d0)
    graph = captured(lambda: comm.all_to_all_v_dynamic(out, xs, counts_of(dst, torch.int32), recv))
    errs = replays(graph, (xs, dst, out, recv), (rows, hidden, dtype), range(60, 64),
                   lambda seed: expected(seed, lambda s: rows, hidden, dtype, cap, out))
    record("graph capture and replay, new routing each time", not errs, "; ".join(errs))


def check_overfull(comm):
    """Room for fewer rows than arrive: the rows are cut at the capacity, the counts say so,
    the next call on the communicator raises naming the capacity, the one after works."""
    dtype, hidden, rows = torch.float32, 3, 500
    cap = 100
    x, dest = tokens(RANK, 70, rows, hidden, dtype)
    recv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    out = poison(torch.empty(WORLD * cap, hidden, dtype=dtype, device=DEV))
    guard = poison(torch.empty(WORLD * cap + 64, hidden, dtype=dtype, device=DEV))
    view = guard[:WORLD * cap]
    comm.all_to_all_v_dynamic(view, x, counts_of(dest, torch.int64), recv)
    want, got = expected(70, lambda s: rows, hidden, dtype, cap, out)
    torch.cuda.synchronize(DEV)
    tail_ok = bool((guard[WORLD * cap:].view(torch.uint8) == 0x7E).all().item())
    record("overfull: rows cut at the capacity",
           same_bytes(view, want) and recv.tolist() == [min(g, cap) for g in got] and tail_ok)
    t = torch.ones(8, device=DEV)
    try:
        comm.all_reduce(t)
        record("overfull: reported by the next call", False, "no error")
    except ferrocomm.FerrocommValueError as e:
        record("overfull: reported by the next call", "capacity" in str(e), str(e))
    t = torch.ones(8, device=DEV)
    comm.all_reduce(t)
    torch.cuda.synchronize(DEV)
    record("overfull: the communicator works again", bool((t == WORLD).all().item()))


def exchange_counts(comm, send):
    """Receive counts from the send counts with an all-to-all of the counts, on the device."""
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv, send)
    return recv


def check_packed(comm):
    """device_alltoallv_single as a MoE dispatch runs it: counts made on the device, exchanged
    with an all-to-all on the device, then the rows, packed; a tail past them keeps its poison."""
    cases = [
        (torch.bfloat16, 7, torch.int64, 1000),
        (torch.float32, 64, torch.int32, 333),
        (torch.float8_e5m2, 5, torch.int64, 2500),
        (torch.bfloat16, 4096, torch.int64, 64),
    ]
    for k, (dtype, hidden, cdt, base) in enumerate(cases):
        seed = 80 + k
        rows_of = lambda s, base=base: base + 37 * s  # noqa: E731
        bound = sum(rows_of(s) for s in range(WORLD)) + 3
        x, dest = tokens(RANK, seed, rows_of(RANK), hidden, dtype)
        send = counts_of(dest, cdt)
        recv = exchange_counts(comm, send)
        out = poison(torch.empty(bound, hidden, dtype=dtype, device=DEV))
        comm.device_alltoallv_single(out, x, recv, send)
        want, got = expected(seed, rows_of, hidden, dtype, None, out)
        torch.cuda.synchronize(DEV)
        name = f"packed {str(dtype)[6:]} rows of {hidden}, {str(cdt)[6:]} counts"
        record(name, same_bytes(out, want) and recv.tolist() == got, f"{recv.tolist()} {got}")


def check_packed_graph(comm):
    """The count kernel, the count exchange and the packed dispatch in one CUDA graph, replayed
    with new routing each time."""
    dtype, hidden, rows = torch.float16, 40, 700
    xs = torch.empty(rows, hidden, dtype=dtype, device=DEV)
    dst = torch.empty(rows, dtype=torch.int64, device=DEV)
    recv = torch.empty(WORLD, dtype=torch.int64, device=DEV)
    out = torch.empty(WORLD * rows + 1, hidden, dtype=dtype, device=DEV)
    x0, d0 = tokens(RANK, 90, rows, hidden, dtype)
    xs.copy_(x0)
    dst.copy_(d0)

    def body():
        send = counts_of(dst, torch.int64)
        comm.all_to_all_single(recv, send)
        comm.device_alltoallv_single(out, xs, recv, send)

    errs = replays(captured(body), (xs, dst, out, recv), (rows, hidden, dtype), range(91, 95),
                   lambda seed: expected(seed, lambda s: rows, hidden, dtype, None, out))
    record("packed: graph capture and replay, new routing each time", not errs, "; ".join(errs))


def check_packed_faults(comm):
    """One rank expects a part longer than sent, then one rank's output is a row short: the
    next call fails on every rank naming the fault, nothing lands past the output, the call
    after works."""
    bad = WORLD - 1
    for fault, needles in (("disagree", ("disagree",)),
                           ("output", ("past its output", "more than the output"))):
        dtype, hidden, rows = torch.float32, 3, 300
        x, dest = tokens(RANK, 95, rows, hidden, dtype)
        send = counts_of(dest, torch.int64)
        recv = exchange_counts(comm, send)
        total = int(recv.sum().item())
        if RANK == bad:
            if fault == "disagree":
                recv[0] += 1
                total += 1
            else:
                total -= 1
        guard = poison(torch.empty(total + 16, hidden, dtype=dtype, device=DEV))
        comm.device_alltoallv_single(guard[:total], x, recv, send)
        torch.cuda.synchronize(DEV)
        tail_ok = bool((guard[total:].view(torch.uint8) == 0x7E).all().item())
        record(f"packed {fault}: nothing past the output", tail_ok)
        t = torch.ones(8, device=DEV)
        try:
            comm.all_reduce(t)
            record(f"packed {fault}: reported by the next call", False, "no error")
        except ferrocomm.FerrocommValueError as e:
            record(f"packed {fault}: reported by the next call",
                   any(n in str(e) for n in needles), str(e))
        t = torch.ones(8, device=DEV)
        comm.all_reduce(t)
        torch.cuda.synchronize(DEV)
        record(f"packed {fault}: the communicator works again", bool((t == WORLD).all().item()))


def check_errors(comm):
    rows = torch.ones(4 * WORLD, 2, device=DEV)
    cnt = torch.full((WORLD,), 2, dtype=torch.int64, device=DEV)
    rcv = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    cases = [
        ("input rows 2", lambda: comm.all_to_all_v_dynamic(
            torch.empty(2 * WORLD, 3, device=DEV), rows, cnt, rcv)),
        ("must be i32", lambda: comm.all_to_all_v_dynamic(
            torch.empty(2 * WORLD, 2, device=DEV), rows, cnt.float(), rcv.float())),
        ("is on cpu", lambda: comm.all_to_all_v_dynamic(
            torch.empty(2 * WORLD, 2, device=DEV), rows, cnt.cpu(), rcv)),
        ("overlap", lambda: comm.all_to_all_v_dynamic(rows[:2 * WORLD], rows, cnt, rcv)),
    ]
    expect_errors(cases)


def main():
    torch.cuda.set_device(DEV)
    comm = ferrocomm.new_comm("ferrocomm", DEV, "check-dynamic")
    assert comm.get_backend() == "cuda", comm
    check_dispatch(comm)
    check_async(comm)
    check_graph(comm)
    check_overfull(comm)
    check_packed(comm)
    check_packed_graph(comm)
    check_packed_faults(comm)
    check_errors(comm)
    finish(comm)


if __name__ == "__main__":
    main()

"""GPU check of windows (one-sided put, signal, wait_signal, map_remote_tensor) and the
persistent all-gather on the cuda backend.

    torchrun --nproc_per_node 2 python/tests/gpu/check_windows.py [--share-gpus]

(``ferrocomm launch -n N`` works too; 2 to 4 ranks.) With ``--share-gpus`` every rank runs on
GPU ``LOCAL_RANK mod count`` and NCCL is not loaded, so several ranks run on one GPU
(correctness only). Every rank derives every peer's data from seeds and checks what landed in
its own tensor against a reference on the device:

- a ring of puts with signals over many rounds, puts below and above
  ``FERROCOMM_PUT_CE_MIN_BYTES`` (a copy kernel and the copy engine), at odd byte offsets too;
- a pipeline (stage i puts to stage i+1, no receive posted);
- puts at random offsets against a reference; every rank into disjoint ranges of one tensor;
- ``map_remote_tensor`` read after the peer's signal;
- refusals with nothing written: offsets past the end, wrong dtypes, registrations that differ
  between ranks, a tensor on the CPU;
- put + signal + wait_signal captured in one CUDA graph and replayed 1,000 times with the data
  changing between replays; the persistent all-gather over 1,000 executions, and captured;
- a KV-cache-shaped transfer (many blocks, one signal) and a MoE-style dispatch by puts;
- a wait ended by ``abort()`` and one by its timeout (reported by the next call).

Prints `[rank R] ok NAME` for each check that passed, `[rank R] FAIL NAME ...` for each that
failed, and a summary per rank; exits 1 on any mismatch.
"""

import time

import torch

import ferrocomm
import shared_check
from shared_check import DEV, RANK, WORLD, captured, finish

NEXT, PREV = (RANK + 1) % WORLD, (RANK - 1) % WORLD


def record(name, ok, detail=""):
    """The tally's record, and a line per passed check too (`[rank R] ok NAME`): the output
    shows what ran, not only what failed."""
    if ok:
        print(f"[rank {RANK}] ok {name}", flush=True)
    shared_check.record(name, ok, detail)


def data(seed, n, dtype=torch.float32):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(n, generator=g, device=DEV).to(dtype)


def sync():
    torch.cuda.synchronize(DEV)


def check_ring(comm):
    """Puts into the next rank's row, signal, wait for the previous rank, check, then answer so
    that the row may be written again. Sizes on both sides of the copy-engine threshold."""
    for n, dtype, rounds in ((1000, torch.float32, 300), (256 * 1024 + 3, torch.float32, 50),
                             (4097, torch.float16, 100)):
        buf = torch.zeros(WORLD, n, dtype=dtype, device=DEV)
        win = comm.new_window(buf)
        ok = True
        for rnd in range(rounds):
            mine = data(rnd * 100 + RANK, n, dtype)
            win.put(mine, NEXT, RANK * n, False)
            win.signal(NEXT, False)
            win.wait_signal(PREV, False)
            want = data(rnd * 100 + PREV, n, dtype)
            ok &= bool(torch.equal(buf[PREV], want))
            win.signal(PREV, False)
            win.wait_signal(NEXT, False)
        sync()
        record(f"ring {n} x {dtype} over {rounds} rounds", ok)
        # An odd element offset into half precision: an unaligned target for either engine.
        part = data(7 + RANK, 33, dtype)
        win.put(part, NEXT, RANK * n + 1, False)
        win.signal(NEXT, False)
        win.wait_signal(PREV, False)
        sync()
        record(f"ring {dtype} at an odd offset",
               bool(torch.equal(buf[PREV, 1:34], data(7 + PREV, 33, dtype))))
        comm.barrier()
        win.tensor_deregister()


def check_pipeline(comm):
    n = 8192
    buf = torch.zeros(n, device=DEV)
    win = comm.new_window(buf)
    ok = True
    for step in range(40):
        if RANK == 0:
            act = data(1000 + step, n)
        else:
            win.wait_signal(RANK - 1, False)
            act = buf + RANK  # ordered after the wait on this stream
            win.signal(RANK - 1, False)
        if RANK == WORLD - 1:
            ok &= bool(torch.allclose(act, data(1000 + step, n) + sum(range(1, WORLD)),
                                      atol=1e-4))
            continue
        if step > 0:
            win.wait_signal(RANK + 1, False)
        win.put(act, RANK + 1, 0, False)
        win.signal(RANK + 1, False)
    if RANK < WORLD - 1:
        win.wait_signal(RANK + 1, False)
    sync()
    record("pipeline of 40 steps", ok)
    win.tensor_deregister()


def check_random_and_disjoint(comm):
    n = 20000

    def pieces(r):
        g = torch.Generator().manual_seed(500 + r)
        out = []
        for k in range(200):
            ln = int(torch.randint(1, 300, (1,), generator=g))
            off = int(torch.randint(0, n - ln + 1, (1,), generator=g))
            out.append((off, torch.arange(ln, device=DEV, dtype=torch.int32) + k * 1000 + r))
        return out

    buf = torch.zeros(n, dtype=torch.int32, device=DEV)
    win = comm.new_window(buf)
    for off, v in pieces(RANK):
        win.put(v, NEXT, off, False)
    win.signal(NEXT, False)
    win.wait_signal(PREV, False)
    want = torch.zeros(n, dtype=torch.int32, device=DEV)
    for off, v in pieces(PREV):
        want[off:off + len(v)] = v
    sync()
    record("puts at random offsets", bool(torch.equal(buf, want)))
    comm.barrier()
    win.tensor_deregister()

    per = 1 << 16
    buf = torch.full((WORLD * per,), -1.0, device=DEV)
    win = comm.new_window(buf)
    for k in range(0, per, 4096):
        v = torch.arange(k, k + 4096, device=DEV, dtype=torch.float32) + RANK * 1e6
        win.put(v, 0, RANK * per + k, False)
    win.signal(0, False)
    if RANK == 0:
        for r in range(WORLD):
            win.wait_signal(r, False)
        want = torch.cat([torch.arange(per, device=DEV, dtype=torch.float32) + r * 1e6
                          for r in range(WORLD)])
        sync()
        record("every rank into disjoint ranges of rank 0", bool(torch.equal(buf, want)))
    comm.barrier()
    win.tensor_deregister()


def check_map_remote(comm):
    buf = torch.zeros(6, 10, dtype=torch.bfloat16, device=DEV)
    win = comm.new_window(buf)
    writer = 1 % WORLD
    if RANK == writer:
        buf.fill_(3.5)
        for p in range(WORLD):
            if p != writer:
                win.signal(p, False)
    else:
        win.wait_signal(writer, False)
        peer = win.map_remote_tensor(writer)
        ok = peer.shape == buf.shape and peer.dtype == buf.dtype
        ok &= bool((peer == 3.5).all())
        record("map_remote_tensor after the signal", ok, str(peer.shape))
    own = win.map_remote_tensor(RANK)
    record("map_remote_tensor of this rank is its tensor", own.data_ptr() == buf.data_ptr())
    attr = win.get_attr(NEXT)
    record("get_attr: unified",
           attr.access_type == ferrocomm.TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED)
    comm.barrier()
    win.tensor_deregister()


def expect(needle, f, *args):
    try:
        f(*args)
        record(f"refused: {needle}", False, "no error")
    except ferrocomm.FerrocommValueError as e:
        record(f"refused: {needle}", needle in str(e), str(e))


def check_refusals(comm):
    buf = torch.full((10,), 7.0, device=DEV)
    win = comm.new_window(buf)
    four = torch.ones(4, device=DEV)
    expect("target_offset_nelems 7", win.put, four, NEXT, 7, False)
    expect("dtype mismatch", win.put, four.half(), NEXT, 0, False)
    expect("dst_rank", win.put, four, WORLD, 0, False)
    expect("is on cpu", win.put, four.cpu(), NEXT, 0, False)
    comm.barrier()
    sync()
    record("refused puts wrote nothing", bool((buf == 7).all()))
    comm.barrier()
    win.tensor_deregister()
    odd = torch.zeros(12 if RANK == WORLD - 1 else 10, device=DEV)
    w2 = comm.new_window()
    expect("ranks registered different buffers", w2.tensor_register, odd)
    ok = torch.zeros(10, device=DEV)
    w2.tensor_register(ok)
    w2.tensor_deregister()


def check_graph(comm):
    """put + signal + wait_signal (and the answer) captured once, replayed 1,000 times with the
    source changing between replays."""
    n = 4096
    buf = torch.zeros(WORLD, n, device=DEV)
    src = torch.zeros(n, device=DEV)
    win = comm.new_window(buf)

    def body():
        win.put(src, NEXT, RANK * n, False)
        win.signal(NEXT, False)
        win.wait_signal(PREV, False)
        # The answer: the row may be written again at the next replay.
        win.signal(PREV, False)
        win.wait_signal(NEXT, False)

    src.copy_(data(RANK, n))
    graph = captured(body)  # ran once eagerly, then captured
    sync()
    wrong = [] if torch.equal(buf[PREV], data(PREV, n)) else ["the eager run"]
    # PREV's first replay puts into that row at once (the answer signal says the row arrived,
    # not that this host has read it): it waits until every rank has looked, here and after
    # each look below.
    comm.barrier()
    base = torch.arange(n, device=DEV, dtype=torch.float32)
    for rep in range(1000):
        src.copy_(base + rep * 10 + RANK)
        graph.replay()
        if rep % 50 == 49 or rep < 3:
            sync()
            if not torch.equal(buf[PREV], base + rep * 10 + PREV):
                wrong.append(f"replay {rep}")
            comm.barrier()
    sync()
    record("put + signal + wait_signal in a CUDA graph, 1,000 replays", not wrong,
           "row of rank %d wrong after %s" % (PREV, ", ".join(wrong)))
    comm.barrier()
    win.tensor_deregister()


def check_all_gather_p(comm):
    part = 3000
    out = torch.zeros(WORLD * part, device=DEV)
    h = comm.all_gather_p_init(out)
    ok = True
    for it in range(1000):
        x = torch.full((part,), float(it), device=DEV) + RANK * 0.5
        comm.all_gather_p_exec(h, x, False)
        if it % 100 == 99:
            sync()
            want = torch.cat([torch.full((part,), float(it), device=DEV) + r * 0.5
                              for r in range(WORLD)])
            ok &= bool(torch.equal(out, want))
    record("persistent all-gather, 1,000 executions", ok)
    mine = out[RANK * part:(RANK + 1) * part]
    mine.fill_(-float(RANK))
    comm.all_gather_p_exec(h, mine, False)
    sync()
    want = torch.cat([torch.full((part,), -float(r), device=DEV) for r in range(WORLD)])
    record("persistent all-gather in place", bool(torch.equal(out, want)))
    x = torch.zeros(part, device=DEV)
    graph = captured(lambda: comm.all_gather_p_exec(h, x, False))
    ok = True
    for rep in range(200):
        x.fill_(rep * 2 + RANK)
        graph.replay()
        if rep % 20 == 19:
            sync()
            want = torch.cat([torch.full((part,), float(rep * 2 + r), device=DEV)
                              for r in range(WORLD)])
            ok &= bool(torch.equal(out, want))
    record("persistent all-gather in a CUDA graph, 200 replays", ok)
    w = comm.all_gather_p_exec(h, torch.ones(part, device=DEV), True)
    w.wait()
    sync()
    record("persistent all-gather async", bool((out == 1).all()))
    comm.barrier()
    comm.all_gather_p_free(h)


def check_kv_cache(comm):
    """The prefill rank (0) puts 512 blocks (k and v of 16 tokens x 8 heads x 128, bf16) into
    the decode rank's (last) cache at the blocks its table names, then signals once."""
    blocks, elems = 512, 2 * 16 * 8 * 128
    cache = torch.zeros(blocks, elems, dtype=torch.bfloat16, device=DEV)
    win = comm.new_window(cache)
    prefill, decode = 0, WORLD - 1
    table = (torch.arange(400) * 7 + 3) % blocks  # 400 distinct blocks (7 is prime to 512)
    kv = data(4242, 400 * elems, torch.bfloat16).view(400, elems)
    if RANK == prefill:
        for b in range(400):
            win.put(kv[b], decode, int(table[b]) * elems, False)
        win.signal(decode, False)
    elif RANK == decode:
        win.wait_signal(prefill, False)
        sync()
        record("KV-cache hand-off: 400 blocks, one signal",
               bool(torch.equal(cache[table.to(DEV)], kv)))
    comm.barrier()
    win.tensor_deregister()


def check_moe_dispatch(comm):
    """Every rank routes its tokens to expert ranks and puts each rank's rows into that rank's
    receive buffer at the sender's slot (capacity per sender), with the counts in a second
    window; one signal per destination."""
    tokens, hidden, cap = 256, 512, 256

    def routed(s):
        g = torch.Generator(device=DEV).manual_seed(900 + s)
        dest = torch.randint(0, WORLD, (tokens,), generator=g, device=DEV)
        x = torch.randn(tokens, hidden, generator=g, device=DEV).to(torch.bfloat16)
        order = torch.argsort(dest, stable=True)
        return x[order].contiguous(), torch.bincount(dest, minlength=WORLD)

    recv = torch.zeros(WORLD, cap, hidden, dtype=torch.bfloat16, device=DEV)
    counts = torch.zeros(WORLD, dtype=torch.int64, device=DEV)
    rows = comm.new_window(recv)
    cnt = comm.new_window(counts)
    x, per = routed(RANK)
    start = 0
    for d, k in enumerate(per.tolist()):
        if k:
            rows.put(x[start:start + k].reshape(-1), d, RANK * cap * hidden, False)
        cnt.put(per[d:d + 1], d, RANK, False)
        rows.signal(d, False)
        start += k
    ok = True
    for s in range(WORLD):
        rows.wait_signal(s, False)
    sync()
    for s in range(WORLD):
        xs, ps = routed(s)
        before = int(ps[:RANK].sum())
        k = int(ps[RANK])
        ok &= int(counts[s]) == k
        ok &= bool(torch.equal(recv[s, :k], xs[before:before + k]))
    record("MoE dispatch by puts", ok)
    comm.barrier()
    rows.tensor_deregister()
    cnt.tensor_deregister()


def check_abort_and_timeout():
    """A waiting kernel ends when the communicator is aborted; a wait past its timeout is
    reported by the next call, naming the peer. Each on a communicator of its own."""
    comm = ferrocomm.new_comm("ferrocomm", DEV, "check-windows-abort", timeout=120)
    buf = torch.zeros(8, device=DEV)
    win = comm.new_window(buf)
    if RANK == 0:
        win.wait_signal(1, False)  # never sent: the stream waits
        t0 = time.monotonic()
        comm.abort()
        sync()  # returns once the waiting kernel has seen the abort
        took = time.monotonic() - t0
        record("abort ends a waiting kernel", took < 60, f"{took:.1f}s")
    comm2 = ferrocomm.new_comm("ferrocomm", DEV, "check-windows-timeout", timeout=120)
    buf2 = torch.zeros(8, device=DEV)
    w2 = comm2.new_window(buf2)
    if RANK == 0:
        w2.wait_signal(1, False, timeout=0.5)
        sync()
        try:
            w2.put(torch.ones(2, device=DEV), 1, 0, False)
            record("a wait's timeout is reported by the next call", False, "no error")
        except ferrocomm.FerrocommTimeout as e:
            record("a wait's timeout is reported by the next call", "rank 1" in str(e), str(e))


def main():
    torch.cuda.set_device(DEV)
    comm = ferrocomm.new_comm("ferrocomm", DEV, "check-windows")
    assert comm.get_backend() == "cuda", comm
    check_ring(comm)
    check_pipeline(comm)
    check_random_and_disjoint(comm)
    check_map_remote(comm)
    check_refusals(comm)
    check_graph(comm)
    check_all_gather_p(comm)
    check_kv_cache(comm)
    check_moe_dispatch(comm)
    comm.barrier()
    check_abort_and_timeout()
    # Rank 1 stays until rank 0 has seen its wait time out: a rank that has left ends a wait
    # for it at once (its watcher sees the process exit), which is not the timeout checked.
    comm.barrier()
    finish(comm)


if __name__ == "__main__":
    main()

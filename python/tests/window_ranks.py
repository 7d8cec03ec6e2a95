"""One rank of a window test: ``python window_ranks.py SCENARIO`` with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (conftest.run_ranks). Windows and the persistent all-gather on
the host backend, ranks as separate processes: every rank derives every peer's data from seeds
and checks what landed in its own buffer against a numpy reference. Exits non-zero on any
mismatch.
"""

import os
import sys
import threading
import time

import numpy as np

import ferrocomm
import rank_scenario
from ferrocomm import FerrocommError, FerrocommTimeout, FerrocommValueError

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
NEXT, PREV = (RANK + 1) % WORLD, (RANK - 1) % WORLD


def expect(exc, needle, f, *args, **kw):
    try:
        f(*args, **kw)
    except exc as e:
        if needle not in str(e):
            raise AssertionError(f"rank {RANK}: {exc.__name__} without {needle!r}: {e}") from e
        return str(e)
    raise AssertionError(f"rank {RANK}: {getattr(f, '__name__', f)} did not raise {exc.__name__}")


def values(seed, n, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def scenario_ring(comm):
    """Each rank puts into the next rank's buffer at its own slot and signals; the next rank
    waits, checks, and answers so that the slot may be written again. 500 rounds."""
    n = 257
    buf = ferrocomm.shared_empty((WORLD, n), np.float32)
    win = comm.new_window(buf)
    assert win.shape == [WORLD, n] and win.dtype == np.float32 and win.get_size() == 4 * WORLD * n
    for rnd in range(500):
        mine = values([RANK, rnd], n)
        win.put(mine, NEXT, RANK * n, False)
        win.signal(NEXT, False)
        win.wait_signal(PREV, False)
        np.testing.assert_array_equal(buf[PREV], values([PREV, rnd], n), f"round {rnd}")
        win.signal(PREV, False)
        win.wait_signal(NEXT, False)
    win.tensor_deregister()
    assert win.get_size() == 0 and win.shape is None


def scenario_ring_async(comm):
    """The ring with async_op=True: the work thread runs the calls in order; waits on works."""
    n = 64
    buf = ferrocomm.shared_empty(WORLD * n, np.int64)
    win = comm.new_window()
    win.tensor_register(buf)
    for rnd in range(100):
        mine = np.arange(n, dtype=np.int64) + 1000 * rnd + RANK
        works = [win.put(mine, NEXT, RANK * n, True), win.signal(NEXT, True),
                 win.wait_signal(PREV, True)]
        works[-1].wait()
        assert all(w.is_completed() for w in works)
        got = buf[PREV * n:(PREV + 1) * n]
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.int64) + 1000 * rnd + PREV)
        win.signal(PREV, True).wait()
        win.wait_signal(NEXT, True).wait()
    win.tensor_deregister()


def scenario_pipeline(comm):
    """Stage i puts its activations into stage i+1's buffer, no receive posted; stage i+1
    waits for the signal, adds its rank and passes on. The last stage checks every step."""
    n = 1024
    buf = ferrocomm.shared_empty(n, np.float32)
    win = comm.new_window(buf)
    for step in range(40):
        if RANK == 0:
            act = values([step], n)
        else:
            win.wait_signal(RANK - 1, False)
            act = buf + RANK
            win.signal(RANK - 1, False)  # the buffer is free for the next step
        if RANK == WORLD - 1:
            want = values([step], n).astype(np.float64) + sum(range(1, WORLD))
            np.testing.assert_allclose(act, want, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
            continue
        if step > 0:
            win.wait_signal(RANK + 1, False)
        win.put(act, RANK + 1, 0, False)
        win.signal(RANK + 1, False)
    if RANK < WORLD - 1:
        win.wait_signal(RANK + 1, False)
    win.tensor_deregister()


def scenario_random_offsets(comm):
    """Many puts of random lengths at random offsets into the next rank; the target replays the
    sender's generator and compares the whole buffer with the reference."""
    n = 5000

    def pieces(r):
        rng = np.random.default_rng([99, r])
        for k in range(300):
            ln = int(rng.integers(1, 80))
            off = int(rng.integers(0, n - ln + 1))
            yield off, (np.arange(ln, dtype=np.int32) * 7 + k * 1000 + r)

    buf = ferrocomm.shared_empty(n, np.int32)
    win = comm.new_window(buf)
    for off, v in pieces(RANK):
        win.put(v, NEXT, off, False)
    win.signal(NEXT, False)
    win.wait_signal(PREV, False)
    want = np.zeros(n, np.int32)
    for off, v in pieces(PREV):
        want[off:off + len(v)] = v
    np.testing.assert_array_equal(buf, want)
    win.tensor_deregister()


def scenario_disjoint(comm):
    """Every rank (rank 0 too, into its own buffer) writes its own range of rank 0's buffer in
    many small puts at once; rank 0 waits for every signal and checks every element."""
    per = 4096
    buf = ferrocomm.shared_empty(WORLD * per, np.float64)
    buf[:] = -1
    win = comm.new_window(buf)
    comm.barrier()  # the -1 fill is done everywhere before anyone writes
    for k in range(0, per, 128):
        v = np.arange(k, k + 128, dtype=np.float64) + RANK * 1e6
        win.put(v, 0, RANK * per + k, False)
    win.signal(0, False)
    if RANK == 0:
        for r in range(WORLD):
            win.wait_signal(r, False)
        want = np.concatenate([np.arange(per, dtype=np.float64) + r * 1e6 for r in range(WORLD)])
        np.testing.assert_array_equal(buf, want)
    comm.barrier()
    win.tensor_deregister()


def scenario_map_remote(comm):
    """A rank writes its own buffer in place and signals; each peer reads it through
    map_remote_tensor after the wait. Torch CPU tensors too, bf16 included."""
    import torch

    for make in (lambda: ferrocomm.shared_empty((3, 5), np.float32),
                 lambda: ferrocomm.shared_empty((4, 6), torch.bfloat16)):
        buf = make()
        win = comm.new_window(buf)
        writer = 1 % WORLD
        if RANK == writer:
            buf[...] = 42.5
            for p in range(WORLD):
                if p != writer:
                    win.signal(p, False)
        else:
            win.wait_signal(writer, False)
            peer = win.map_remote_tensor(writer)
            assert tuple(peer.shape) == tuple(buf.shape) and peer.dtype == buf.dtype, peer
            assert (peer == 42.5).all(), peer
        own = win.map_remote_tensor(RANK)
        ptr = own.__array_interface__["data"][0] if isinstance(own, np.ndarray) \
            else own.data_ptr()
        want = buf.__array_interface__["data"][0] if isinstance(buf, np.ndarray) \
            else buf.data_ptr()
        assert ptr == want
        assert win.get_attr(NEXT).access_type == \
            ferrocomm.TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED
        comm.barrier()
        win.tensor_deregister()


def scenario_refusals(comm):
    """Bad puts, wrong dtypes and mismatched registrations: refused on every rank, nothing
    written anywhere (every rank checks its own buffer after all have tried)."""
    V = FerrocommValueError
    buf = ferrocomm.shared_empty(10, np.float32)
    buf[:] = 7
    win = comm.new_window(buf)
    four = np.ones(4, np.float32)
    expect(V, "target_offset_nelems 7", win.put, four, NEXT, 7, False)
    expect(V, "out of range", win.put, four, NEXT, -1, False)
    expect(V, "out of range", win.put, four, NEXT, 2**64, False)
    expect(V, "past the end", win.put, four, NEXT, 2**63 - 2, False)
    expect(V, "dtype mismatch", win.put, np.ones(2, np.float64), NEXT, 0, False)
    expect(V, "dtype mismatch", win.put, np.ones(2, np.int32), NEXT, 0, False)
    expect(V, "dst_rank", win.put, four, WORLD, 0, False)
    expect(V, "must be a bool, not list", win.put, four, NEXT, 0, [1, 2])
    expect(V, "not contiguous", win.put, np.ones(8, np.float32)[::2], NEXT, 0, False)
    expect(V, "peer_rank", win.signal, WORLD, False)
    expect(V, "peer_rank", win.wait_signal, -1, False)
    expect(V, "rank", win.map_remote_tensor, WORLD)
    expect(V, "registered buffer already", win.tensor_register, buf)
    comm.barrier()
    assert (buf == 7).all(), buf
    comm.barrier()
    # A put that ends exactly at the end is taken.
    win.put(four[:3], NEXT, 7, False)
    win.signal(NEXT, False)
    win.wait_signal(PREV, False)
    np.testing.assert_array_equal(buf, [7] * 7 + [1] * 3)
    comm.barrier()
    win.tensor_deregister()
    expect(V, "no buffer is registered", win.put, four, NEXT, 0, False)

    # Registrations that differ between ranks: refused on every rank, naming each one.
    bad = ferrocomm.shared_empty(12 if RANK == WORLD - 1 else 10, np.float32)
    bad[:] = 3
    w2 = comm.new_window()
    msg = expect(V, "ranks registered different buffers", w2.tensor_register, bad)
    assert f"rank {WORLD - 1} float x 12" in msg and "rank 0 float x 10" in msg, msg
    same = ferrocomm.shared_empty(10, np.int32 if RANK == 0 else np.float32)
    msg = expect(V, "ranks registered different buffers", w2.tensor_register, same)
    assert "rank 0 int32 x 10" in msg, msg
    # Memory peers cannot map (a plain numpy array) on the last rank only: every rank refused.
    plain = np.zeros(10, np.float32) if RANK == WORLD - 1 else ferrocomm.shared_empty(10,
                                                                                      np.float32)
    if RANK == WORLD - 1:
        expect(V, "shared memory", w2.tensor_register, plain)
    else:
        msg = expect(V, "tensor_register refused on every rank", w2.tensor_register, plain)
        assert f"(rank {WORLD - 1}: " in msg and "shared memory" in msg, msg
    assert (bad == 3).all()
    # Still usable: the same buffers register.
    ok = ferrocomm.shared_empty(10, np.float32)
    w2.tensor_register(ok)
    w2.tensor_deregister()
    # The persistent all-gather's output must divide into equal parts: refused on every rank.
    odd = ferrocomm.shared_empty(WORLD * 3 + 1, np.float32)
    expect(V, "equal parts", comm.all_gather_p_init, odd)


def scenario_all_gather_p(comm):
    """The persistent all-gather over 1,000 executions with new inputs, then in place, async,
    torch tensors, and its refusals."""
    import torch

    part = 37
    out = ferrocomm.shared_empty(WORLD * part, np.float32)
    h = comm.all_gather_p_init(out)
    for it in range(1000):
        x = np.arange(part, dtype=np.float32) + it * 1000 + RANK * 0.25
        comm.all_gather_p_exec(h, x, False)
        for r in range(WORLD):
            np.testing.assert_array_equal(out[r * part:(r + 1) * part],
                                          np.arange(part, dtype=np.float32) + it * 1000 + r * 0.25,
                                          f"execution {it}")
    # In place: the input is this rank's part of the output.
    out[RANK * part:(RANK + 1) * part] = -RANK
    comm.all_gather_p_exec(h, out[RANK * part:(RANK + 1) * part], False)
    for r in range(WORLD):
        assert (out[r * part:(r + 1) * part] == -r).all()
    w = comm.all_gather_p_exec(h, np.full(part, 5.0, np.float32), True)
    w.wait()
    assert (out == 5).all()
    expect(FerrocommValueError, "input has 3 elements", comm.all_gather_p_exec, h,
           np.ones(3, np.float32), False)
    expect(FerrocommValueError, "dtype mismatch", comm.all_gather_p_exec, h,
           np.ones(part, np.float64), False)
    comm.all_gather_p_free(h)
    expect(FerrocommValueError, "freed", comm.all_gather_p_exec, h, np.ones(part, np.float32),
           False)
    # Torch CPU tensors (bf16), the output 2-d.
    t = ferrocomm.shared_empty((WORLD, 8), torch.bfloat16)
    h = comm.all_gather_p_init(t, timeout=60)
    for it in range(50):
        comm.all_gather_p_exec(h, torch.full((8,), float(it + RANK), dtype=torch.bfloat16), False)
        for r in range(WORLD):
            assert (t[r] == it + r).all(), t
    comm.all_gather_p_free(h)


def scenario_kv_handoff(comm):
    """docs/python.md's KV-cache hand-off: the prefill rank (0) puts many cache blocks into
    the decode rank's (last) cache and signals once; the decode rank waits and checks."""
    import torch

    blocks, block_elems = 64, 2 * 16 * 32  # (k, v) x 16 tokens x 32 head elements
    cache = ferrocomm.shared_empty((blocks, block_elems), torch.float16)
    win = comm.new_window(cache)
    prefill, decode = 0, WORLD - 1
    table = [(b * 7) % blocks for b in range(blocks)]  # the decode rank's free blocks
    if RANK == prefill:
        kv = torch.arange(blocks * block_elems, dtype=torch.float32).reshape(blocks, -1)
        kv = (kv % 1000).to(torch.float16)
        for b in range(blocks):
            win.put(kv[b], decode, table[b] * block_elems, False)
        win.signal(decode, False)
    elif RANK == decode:
        win.wait_signal(prefill, False)
        kv = torch.arange(blocks * block_elems, dtype=torch.float32).reshape(blocks, -1)
        kv = (kv % 1000).to(torch.float16)
        for b in range(blocks):
            assert torch.equal(cache[table[b]], kv[b]), b
    comm.barrier()
    win.tensor_deregister()


def scenario_wait_timeout(comm):
    """Rank 0 waits for a signal rank 1 never sends: FerrocommTimeout naming rank 1 within the
    call's timeout, and the communicator is aborted; another thread's abort() ends a wait."""
    buf = ferrocomm.shared_empty(8, np.float32)
    win = comm.new_window(buf)
    if RANK == 0:
        t0 = time.monotonic()
        expect(FerrocommTimeout, "waiting for rank 1", win.wait_signal, 1, False, timeout=0.5)
        assert time.monotonic() - t0 < 10
        assert comm.is_aborted()
        expect(FerrocommError, "aborted", win.put, np.ones(2, np.float32), 1, 0, False)
    comm2 = ferrocomm.new_comm("host", "cpu", "second", timeout=60)
    buf2 = ferrocomm.shared_empty(8, np.float32)
    w2 = comm2.new_window(buf2)
    if RANK == 0:
        # An abort from another thread, whenever it comes, ends the wait (60 s otherwise).
        out = {}
        waiter = threading.Thread(target=lambda: out.setdefault(
            "e", _raised(w2.wait_signal, 1, False)))
        waiter.start()
        t0 = time.monotonic()
        comm2.abort()
        waiter.join(30)
        assert not waiter.is_alive() and isinstance(out["e"], FerrocommError), out
        assert time.monotonic() - t0 < 20


def _raised(f, *args):
    try:
        f(*args)
    except Exception as e:  # noqa: BLE001 - the caller checks the class
        return e
    return None


def scenario_peer_exits(comm):
    """The last rank registers and exits without signalling: a wait for it fails at once
    naming it (its process is gone), long before the communicator's 60 s timeout."""
    buf = ferrocomm.shared_empty(8, np.float32)
    win = comm.new_window(buf)
    gone = WORLD - 1
    if RANK == gone:
        sys.stdout.flush()
        os._exit(0)
    t0 = time.monotonic()
    expect(FerrocommError, f"rank {gone} failed or exited", win.wait_signal, gone, False)
    assert time.monotonic() - t0 < 30
    os._exit(0)


def main():
    scenario = sys.argv[1]
    timeout = float(os.environ.get("FERROCOMM_TEST_TIMEOUT", "60"))
    comm = ferrocomm.new_comm("host", "cpu", "window-test", timeout=timeout)

    def body():
        globals()["scenario_" + scenario](comm)
        if not comm.is_aborted():
            comm.finalize()

    rank_scenario.run(RANK, scenario, body)


if __name__ == "__main__":
    main()

"""One rank of the reliability tests (test_reliability.py): `python reliability_ranks.py SCENARIO`
with torchrun's variables set. Prints what the parent checks; exits non-zero on a failed check."""

import os
import sys
import time

import numpy as np

import ferrocomm
from ferrocomm import hooks


def scenario_kill(comm):
    """Rank 1 parks after one call until the parent kills it; the others call on."""
    x = np.full(1000, comm.rank + 1.0, dtype=np.float32)
    comm.all_reduce(x)
    assert x[0] == sum(range(1, comm.size + 1)), x[0]
    if comm.rank == 1:
        print("PARKED", flush=True)
        sys.stdin.readline()
        time.sleep(60)
        return
    print("CALLING", flush=True)
    try:
        comm.all_reduce(x)
    except ferrocomm.FerrocommPeerFailed as e:
        print("FAILED", time.monotonic(), e, flush=True)
        assert "rank 1" in str(e) and "flight recorder dumps: " in str(e), e
        assert comm.get_trace_dir() in str(e), e
        assert comm.is_aborted()
    else:
        raise AssertionError("the call went through without rank 1")
    try:
        comm.barrier()
    except ferrocomm.FerrocommError as e:
        print("LATER", type(e).__name__, e, flush=True)
    print("DONE", flush=True)


def scenario_hooks(comm):
    seen = []
    pre = comm.register_pre_hook(lambda name, op_id, args: seen.append(("pre", name, op_id, args)))
    post = comm.register_post_hook(lambda op_id, args: seen.append(("post", op_id, args)))
    x = np.arange(8, dtype=np.float32)
    comm.all_reduce(x, ferrocomm.ReduceOp.MAX)
    comm.broadcast(x, root=1)
    out = np.zeros(8 * comm.size, dtype=np.float32)
    comm.all_gather_single(out, x)
    if comm.rank == 0:
        comm.send(x, 1)
    else:
        comm.recv(x, 0)
    work = comm.barrier(async_op=True)
    work.wait()
    names = [s[1] for s in seen if s[0] == "pre"]
    O = hooks.OpName
    assert names == [O.all_reduce, O.broadcast, O.all_gather_single,
                     O.send if comm.rank == 0 else O.recv, O.barrier], names
    pres = [s for s in seen if s[0] == "pre"]
    posts = [s for s in seen if s[0] == "post"]
    # Every call: its pre-hook, then its post-hook with the same op id, ids growing.
    assert [s[0] for s in seen] == ["pre", "post"] * 5, [s[0] for s in seen]
    assert [p[2] for p in pres] == [p[1] for p in posts]
    assert all(a[2] < b[2] for a, b in zip(pres, pres[1:]))
    a = pres[0][3]
    assert type(a).__name__ == "AllReducePreHookArgs" and a.tensor is x and not a.async_op
    assert a.op == ferrocomm.ReduceOp.MAX
    assert pres[1][3].root == 1
    assert pres[2][3].output is out and pres[2][3].input is x
    assert pres[3][3].peer == (1 if comm.rank == 0 else 0)
    assert pres[4][3].async_op is True
    assert posts[4][2].work is work
    pre.remove()
    post.remove()
    # Removed: nothing more is seen, and the method is the class's own again.
    comm.all_reduce(x)
    assert len(seen) == 10
    assert "all_reduce" not in comm.__dict__
    aborted = []
    comm.register_abort_hook(lambda: aborted.append(comm.rank))
    comm.barrier()
    comm.abort()
    comm.abort()
    assert aborted == [comm.rank], aborted
    print("hooks ok", flush=True)


def scenario_check_calls(comm):
    """FERROCOMM_CHECK_CALLS=1: a call that differs raises on every rank at that call, and the
    communicator goes on (nothing ran)."""
    x = np.ones(16 if comm.rank != 2 else 17, dtype=np.float32)
    try:
        comm.all_reduce(x)
    except ferrocomm.FerrocommValueError as e:
        print("MISMATCH", e, flush=True)
        assert "call #1" in str(e) and "count=17" in str(e), e
    else:
        raise AssertionError("a call with different counts ran")
    y = np.ones(16, dtype=np.float32)
    comm.all_reduce(y)
    assert y[0] == comm.size, y[0]
    # All-to-all-v whose counts disagree between ranks 0 and 1.
    n = comm.size
    send = [1] * n
    if comm.rank == 0:
        send[1] = 2
    recv = [1] * n
    inp = np.zeros(sum(send), dtype=np.float32)
    out = np.zeros(sum(recv), dtype=np.float32)
    try:
        comm.all_to_all_v_single(out, inp, recv, send)
    except ferrocomm.FerrocommValueError as e:
        print("A2AV", e, flush=True)
        assert "rank 0 sends 2 elements to rank 1, which expects 1" in str(e), e
    else:
        raise AssertionError("all-to-all-v counts that disagree ran")
    comm.barrier()
    print("check_calls ok", flush=True)


def scenario_refuse(comm):
    """A rank whose arguments are wrong there alone refuses the call: the others fail it at
    once (not after the 30 s timeout), naming that rank and its error."""
    n = comm.size
    x = np.ones((2 * n, 3), dtype=np.float32)
    out = np.zeros_like(x)
    sizes = [2] * n
    if comm.rank == 2:
        sizes[0] = 3  # splits that run past its input's rows: refused on rank 2 alone
    t0 = time.monotonic()
    try:
        comm.all_to_all_v_single(out, x, sizes, sizes)
    except ferrocomm.FerrocommValueError as e:
        took = time.monotonic() - t0
        print("REFUSED", f"{took:.3f}", e, flush=True)
        assert took < 5, took
        if comm.rank == 2:
            assert "do not add up to its" in str(e), e
        else:
            assert "rank 2 refused this call" in str(e) and "split_sizes" in str(e), e
    else:
        raise AssertionError("a call that rank 2 refused went through")
    print("refuse ok", flush=True)


def scenario_skip(comm):
    """Rank 1 skips the barrier the others make: every rank fails at that call (the host
    backend compares calls), each dumps its flight recorder."""
    x = np.ones(32, dtype=np.float32)
    comm.all_reduce(x)
    try:
        if comm.rank == 1:
            comm.all_reduce(x)
        else:
            comm.barrier()
    except ferrocomm.FerrocommError as e:
        print("MISMATCH", type(e).__name__, e, flush=True)
    else:
        raise AssertionError("ranks that called different things both went on")
    print("skip ok", flush=True)


def scenario_sigusr1(comm):
    """FERROCOMM_TRACE_ON_SIGUSR1=1: after a call, the rank says its pid and waits for the
    parent (which may signal it meanwhile), then leaves."""
    x = np.ones(64, dtype=np.float32)
    comm.all_reduce(x)
    assert x[0] == comm.size, x[0]
    print("READY", os.getpid(), flush=True)
    sys.stdin.readline()
    comm.finalize()
    print("sigusr1 ok", flush=True)


def scenario_port_taken(comm_unused):
    """No torch.distributed, MASTER_PORT held by another listener: rank 0 cannot start the
    store and the error names the variable to set."""
    try:
        ferrocomm.new_comm("host", "cpu", "port_taken")
    except ferrocomm.FerrocommError as e:
        print("REFUSED", type(e).__name__, e, flush=True)
        assert "MASTER_PORT" in str(e) and "FERROCOMM_STORE_PORT" in str(e), e
        assert "init_process_group" in str(e), e
    else:
        raise AssertionError("a store started on a port that is taken")
    print("port_taken ok", flush=True)


def scenario_torch_store(comm_unused):
    """init_process_group("gloo") with MASTER_ADDR/PORT set by hand (no torchrun), then
    new_comm: it meets through torch's store, MASTER_PORT being taken by it."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    comm = ferrocomm.new_comm("host", "cpu", "after_gloo")
    t = torch.full((4,), float(comm.rank + 1))
    comm.all_reduce(t)
    assert t.tolist() == [float(sum(range(1, comm.size + 1)))] * 4, t
    comm.finalize()
    dist.destroy_process_group()
    print("torch_store ok", flush=True)


def main():
    scenario = sys.argv[1]
    f = globals()[f"scenario_{scenario}"]
    if scenario in ("torch_store", "port_taken"):
        f(None)
        return
    comm = ferrocomm.new_comm("host", "cpu", "reliability", timeout=30)
    f(comm)


if __name__ == "__main__":
    main()

"""One rank of the torch.distributed backend tests: `python torch_ranks.py SCENARIO`.

Every collective runs on the "ferrocomm" group and on a gloo group with the same inputs in the
same process; the results must match (exactly: the data are small integers, whose sums and
products are exact in every dtype used). Launched by test_torch.py through conftest.run_ranks.
"""

import datetime
import faulthandler
import os
import re
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import ferrocomm
import rank_scenario
import ferrocomm.torch as fct

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
# The GPU check runs the same scenarios on CUDA tensors (gloo on CPU copies as the reference)
# and compiles with inductor; CI runs them on CPU tensors with aot_eager (no C++ compiler).
DEV = torch.device(os.environ.get("FERROCOMM_TEST_DEVICE", "cpu"))
COMPILE_BACKEND = os.environ.get("FERROCOMM_TEST_COMPILE", "aot_eager")


def data(shape, dtype, salt, lo=-4, hi=5):
    g = torch.Generator().manual_seed(1000 * salt + RANK)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def same(what, got, want):
    if isinstance(got, (list, tuple)):
        assert len(got) == len(want), f"{what}: {len(got)} entries, expected {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            same(f"{what}[{k}]", g, w)
        return
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert torch.equal(got, want), f"{what}: got {got}, expected {want}"


def _cpu(t):
    return [_cpu(x) for x in t] if isinstance(t, (list, tuple)) else t.cpu()


def both(what, fn, *tensors):
    """fn(group, *tensors) on the ferrocomm world group with copies of `tensors` on DEV, and
    on the gloo group with CPU copies; equal results."""
    mine = fn(None, *[t.to(DEV, copy=True) for t in tensors])
    ref = fn(GLOO, *[t.clone() for t in tensors])
    same(what, _cpu(mine), ref)


def _waited(t):
    """A functional collective's result (an AsyncCollectiveTensor) as a plain tensor."""
    return t.wait() if hasattr(t, "wait") else t


def init(backend="ferrocomm", **kw):
    # A deadline only a hang reaches, also on busy cores.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300), **kw)
    global GLOO
    GLOO = dist.new_group(backend="gloo")


# ---------------------------------------------------------------------------------------------


def scenario_collectives():
    """Every c10d collective, the object collectives and the functional collectives."""
    init()
    collectives()
    dist.barrier()
    dist.destroy_process_group()
    print("collectives ok")


def reduce_dtypes():
    """The DTYPES this group reduces. On CUDA without NCCL underneath (ranks sharing one GPU)
    direct access reduces 32-bit and narrower types: a float64 reduction is refused with an
    error naming NCCL, which is checked here; data movement of float64 is still checked."""
    if DEV.type != "cuda":
        return list(DTYPES)
    x = torch.ones(4, dtype=torch.float64, device=DEV)
    try:
        dist.all_reduce(x)
    except ferrocomm.FerrocommUnsupported as e:
        assert "NCCL" in str(e), f"float64 all_reduce refused without naming NCCL: {e}"
        return [d for d in DTYPES if d != torch.float64]
    assert torch.equal(x.cpu(), torch.full((4,), float(WORLD), dtype=torch.float64)), x
    return list(DTYPES)


def collectives():
    """The body of scenario_collectives, on the initialized default group (DEV's tensors)."""
    assert dist.get_backend() == "ferrocomm"
    assert isinstance(dist.group.WORLD, fct.ProcessGroupFerrocomm)
    n = 7
    reduces = reduce_dtypes()
    for k, dt in enumerate(DTYPES):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN,
                   dist.ReduceOp.PRODUCT):
            if dt not in reduces:
                break
            lo, hi = (1, 3) if op == dist.ReduceOp.PRODUCT else (-4, 5)

            def ar(g, x, op=op):
                dist.all_reduce(x, op=op, group=g)
                return x
            both(f"all_reduce {dt} {op}", ar, data((n, 3), dt, k, lo, hi))

        x = data((n,), dt, 10 + k)
        for root in range(WORLD):
            def bc(g, y, root=root):
                dist.broadcast(y, src=root, group=g)
                return y
            both(f"broadcast {dt} root {root}", bc, x)

            def rd(g, y, root=root):
                dist.reduce(y, dst=root, group=g)
                # Off the root the tensor is unspecified (gloo writes partial sums into it).
                return [y] if RANK == root else []
            if dt in reduces:
                both(f"reduce {dt} root {root}", rd, x)

            def ga(g, y, root=root):
                out = [torch.empty_like(y) for _ in range(WORLD)] if RANK == root else None
                dist.gather(y, out, dst=root, group=g)
                return out if out is not None else []
            both(f"gather {dt} root {root}", ga, x)

            def sc(g, y, root=root):
                out = torch.empty_like(y)
                src = [y + r for r in range(WORLD)] if RANK == root else None
                dist.scatter(out, src, src=root, group=g)
                return out
            both(f"scatter {dt} root {root}", sc, x)

        def ag(g, y):
            out = [torch.empty_like(y) for _ in range(WORLD)]
            dist.all_gather(out, y, group=g)
            return out
        both(f"all_gather {dt}", ag, x)

        def agt(g, y):
            out = y.new_empty((WORLD * n,))
            dist.all_gather_into_tensor(out, y, group=g)
            return out
        both(f"all_gather_into_tensor {dt}", agt, x)

        def rst(g, big):
            out = big.new_empty((3, 2))
            dist.reduce_scatter_tensor(out, big, group=g)
            return out
        if dt in reduces:
            both(f"reduce_scatter_tensor {dt}", rst, data((WORLD * 3, 2), dt, 30 + k))

        # Uneven parts: rank r sends j + r + 1 rows to rank j.
        send = [j + RANK + 1 for j in range(WORLD)]
        recv = [RANK + i + 1 for i in range(WORLD)]

        def a2as(g, flat):
            out = flat.new_empty((sum(recv), 2))
            dist.all_to_all_single(out, flat, recv, send, group=g)
            return out
        both(f"all_to_all_single uneven {dt}", a2as, data((sum(send), 2), dt, 50 + k))

        def a2ae(g, even):
            out = torch.empty_like(even)
            dist.all_to_all_single(out, even, group=g)
            return out
        both(f"all_to_all_single {dt}", a2ae, data((WORLD * 2,), dt, 60 + k))

        # gloo has neither the list all_to_all nor reduce_scatter: the references are its
        # all_to_all_single and all_reduce.
        ins = [data((j + RANK + 1,), dt, 40 + k + j) for j in range(WORLD)]
        out = [t.new_empty((RANK + i + 1,), device=DEV) for i, t in enumerate(ins)]
        dist.all_to_all(out, [t.to(DEV) for t in ins])
        flat = torch.cat(ins).new_empty((sum(recv),))
        dist.all_to_all_single(flat, torch.cat(ins), recv, send, group=GLOO)
        same(f"all_to_all {dt}", _cpu(out), list(flat.split(recv)))

        parts = [data((r + 2,), dt, 20 + k + r) for r in range(WORLD)]
        for what, sizes in (("uneven", None), ("even", 3)) if dt in reduces else ():
            if sizes is not None:
                parts = [data((sizes,), dt, 25 + k + r) for r in range(WORLD)]
            got = torch.empty_like(parts[RANK], device=DEV)
            dist.reduce_scatter(got, [p.to(DEV) for p in parts])
            sums = [p.clone() for p in parts]
            for p in sums:
                dist.all_reduce(p, group=GLOO)
            same(f"reduce_scatter {what} {dt}", _cpu(got), sums[RANK])

    # AVG (gloo has none: SUM / world), bf16 and fp16 against float32 through gloo.
    x = data((9,), torch.float32, 70) * WORLD
    y = x.to(DEV)
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    want = x.clone()
    dist.all_reduce(want, group=GLOO)
    same("all_reduce AVG", _cpu(y), want / WORLD)
    for dt in (torch.bfloat16, torch.float16):
        y = x.to(DEV, dt)
        dist.all_reduce(y)
        same(f"all_reduce {dt}", _cpu(y), want.to(dt))

    # Point to point: a ring through batch_isend_irecv, blocking send/recv, isend/irecv.
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD

    def ring(g, t):
        got = torch.empty_like(t)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, nxt, group=g),
                                       dist.P2POp(dist.irecv, got, prv, group=g)])
        for q in reqs:
            q.wait()
        return got
    both("batch_isend_irecv ring", ring, data((5,), torch.float32, 80))
    if RANK in (0, 1):
        peer = 1 - RANK

        def pair(g, t):
            buf = torch.empty_like(t)
            if RANK == 0:
                dist.send(t, dst=1, group=g)
                dist.recv(buf, src=1, group=g)
            else:
                dist.recv(buf, src=0, group=g)
                dist.send(t, dst=0, group=g)
            q = dist.isend(t, dst=peer, group=g) if RANK == 0 else \
                dist.irecv(buf, src=peer, group=g)
            q.wait()
            return buf
        both("send/recv, isend/irecv", pair, data((5,), torch.float32, 81))

    # Object collectives go through the tensor ones.
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(WORLD)], objs
    lst = [{"from": RANK}, RANK * 10]
    dist.broadcast_object_list(lst, src=WORLD - 1)
    assert lst == [{"from": WORLD - 1}, (WORLD - 1) * 10], lst
    gathered = [None] * WORLD if RANK == 0 else None
    dist.gather_object(("g", RANK), gathered, dst=0)
    if RANK == 0:
        assert gathered == [("g", r) for r in range(WORLD)], gathered
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(WORLD)] if RANK == 0 else None,
                             src=0)
    assert out == [f"to {RANK}"], out

    # Functional collectives (eager, then torch.compile(fullgraph=True)).
    for what, f in (
        ("fc.all_reduce", lambda g, t: fc.all_reduce(t, "sum", g)),
        ("fc.all_gather_tensor", lambda g, t: fc.all_gather_tensor(t, 0, g)),
        ("fc.reduce_scatter_tensor", lambda g, t: fc.reduce_scatter_tensor(t, "sum", 0, g)),
        ("fc.all_to_all_single", lambda g, t: fc.all_to_all_single(t, None, None, g)),
        ("fc.broadcast", lambda g, t: fc.broadcast(t, 1, g)),
    ):
        both(what, lambda g, t, f=f: _waited(f(g or dist.group.WORLD, t)),
             data((WORLD * 2, 3), torch.float32, 90))

    def step(t, g):
        return fc.all_reduce(t * 2, "sum", g) + 1

    compiled = torch.compile(step, fullgraph=True, backend=COMPILE_BACKEND)
    both("torch.compile(fullgraph=True) fc.all_reduce",
         lambda g, t: compiled(t, g or dist.group.WORLD) if g is None else step(t, g),
         data((4, 4), torch.float32, 91))


def scenario_async():
    """async_op=True returns while a peer has not called yet; Work's wait, is_completed and
    get_future; several calls in flight."""
    init()
    x = torch.ones(1000) * (RANK + 1)
    total = WORLD * (WORLD + 1) / 2
    if RANK == 0:
        # The others call only after the gloo barrier below, which rank 0 reaches after its
        # call has returned: a call that waited for them would never return.
        w = dist.all_reduce(x, async_op=True)
        assert not w.is_completed(), "completed although a peer has not called it yet"
        dist.barrier(group=GLOO)
        fut = w.get_future()
        res = fut.wait()
        assert torch.equal(res[0], torch.full((1000,), total)), res
        assert w.is_completed()
    else:
        dist.barrier(group=GLOO)
        dist.all_reduce(x, async_op=True).wait()
    ys = [torch.full((64,), float(RANK + k)) for k in range(5)]
    works = [dist.all_reduce(y, async_op=True) for y in ys]
    outs = [torch.empty(64 * WORLD) for _ in range(2)]
    works += [dist.all_gather_into_tensor(o, ys[0], async_op=True) for o in outs]
    for w in reversed(works):
        w.wait()
    for k, y in enumerate(ys):
        assert torch.equal(y, torch.full((64,), total - WORLD + WORLD * k)), (k, y)
    for o in outs:
        assert o.shape[0] == 64 * WORLD
    dist.destroy_process_group()
    print("async ok")


def scenario_groups():
    """new_group with ferrocomm (disjoint pairs, one listed backwards), cpu:gloo,cuda:ferrocomm,
    low precision per group (pg_options) and per call (ferrocomm.torch.hints)."""
    init()
    evens = list(range(0, WORLD, 2))
    odds = list(range(1, WORLD, 2))
    ge = dist.new_group(evens, backend="ferrocomm")
    go = dist.new_group(odds[::-1], backend="ferrocomm")
    mine = ge if RANK % 2 == 0 else go
    members = evens if RANK % 2 == 0 else odds
    x = torch.full((10,), float(RANK))
    dist.all_reduce(x, group=mine)
    assert torch.equal(x, torch.full((10,), float(sum(members)))), x
    out = [torch.empty(2) for _ in members]
    dist.all_gather(out, torch.full((2,), float(RANK)), group=mine)
    # torch orders a group's ranks (new_group sorts the list).
    assert [int(o[0]) for o in out] == members, out

    # The fused all-reduce + residual + RMSNorm, ferrocomm's extension, on a process group:
    # against gloo's all-reduce, the residual add and the norm in float64.
    rows, hidden, eps = 3, 16, 1e-5
    xs = data((rows, hidden), torch.float32, 90)
    res = data((rows, hidden), torch.float32, 91) + 0.5
    w = torch.linspace(0.5, 1.5, hidden)
    want = xs.clone()
    dist.all_reduce(want, group=GLOO)
    r = want.double() + res.double()
    y = r / torch.sqrt((r * r).mean(-1, keepdim=True) + eps) * w.double()
    x_in, res_in = xs.clone(), res.clone()
    got, got_res = ferrocomm.all_reduce_rmsnorm(x_in, res_in, w, eps, group=dist.group.WORLD)
    assert got.data_ptr() == x_in.data_ptr() and got_res.data_ptr() == res_in.data_ptr()
    assert torch.equal(got_res.double(), r.float().double()), (got_res, r)
    assert torch.allclose(got.double(), y, rtol=1e-5, atol=1e-5), (got, y)
    got2, _ = ferrocomm.all_reduce_rmsnorm(xs.clone(), res.clone(), w, eps)  # the default group
    assert torch.equal(got2, got), (got2, got)
    expect(ferrocomm.FerrocommValueError, "process group", ferrocomm.all_reduce_rmsnorm,
           xs.clone(), res.clone(), w, eps, group=object())

    mixed = dist.new_group(backend="cpu:gloo,cuda:ferrocomm")
    assert mixed._cpu_gloo is not None, "CPU tensors of cpu:gloo,cuda:ferrocomm not on gloo"
    y = torch.full((4,), float(RANK + 1))
    dist.all_reduce(y, group=mixed)
    assert torch.equal(y, torch.full((4,), WORLD * (WORLD + 1) / 2)), y
    # A coalesced call there joins gloo's works.
    zs = [torch.full((3,), float(RANK + 1)), torch.full((5,), float(2 * RANK))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated in torch
        dist.all_reduce_coalesced(zs, group=mixed)
    assert torch.equal(zs[0], torch.full((3,), WORLD * (WORLD + 1) / 2)), zs
    assert torch.equal(zs[1], torch.full((5,), float(WORLD * (WORLD - 1)))), zs

    # Low precision: E4M3 blocks have a bounded relative error and every rank gets the same
    # result; the exact sum differs from it.
    g = torch.Generator().manual_seed(7 + RANK)
    v = torch.randn(4096, generator=g)
    exact = v.clone()
    dist.all_reduce(exact, group=GLOO)
    lp = dist.new_group(backend="ferrocomm",
                        pg_options=fct.Options(hints={"low_precision": "e4m3"}))
    for what, run in (
        ("pg_options", lambda t: dist.all_reduce(t, group=lp)),
        ("hints()", lambda t: _with_hints(t)),
    ):
        t = v.clone()
        run(t)
        err = ((t - exact).norm() / exact.norm()).item()
        assert 0 < err < 0.08, f"low precision through {what}: relative error {err}"
        every = [torch.empty_like(t) for _ in range(WORLD)]
        dist.all_gather(every, t, group=GLOO)
        assert all(torch.equal(e, every[0]) for e in every), f"{what}: ranks differ"
    t = v.clone()
    dist.all_reduce(t)
    assert torch.allclose(t, exact, rtol=1e-5, atol=1e-5), "full precision outside hints()"
    dist.destroy_process_group()
    print("groups ok")


def _with_hints(t):
    with fct.hints(low_precision="e4m3"):
        dist.all_reduce(t)


def expect(exc, needle, f, *a, **kw):
    try:
        f(*a, **kw)
    except exc as e:
        assert needle in str(e), f"expected {needle!r} in: {e}"
        return e
    raise AssertionError(f"expected {exc.__name__} ({needle!r})")


def scenario_errors():
    """Bad calls raise ferrocomm's errors naming the problem, on every rank, and the group still
    works afterwards."""
    init()
    x = torch.ones(6)
    expect(ValueError, "elements", dist.all_gather_into_tensor, torch.empty(5), x)
    expect(ValueError, "not contiguous", dist.all_reduce, torch.ones(4, 4).t())
    expect(ferrocomm.FerrocommUnsupported, "PREMUL_SUM", dist.all_reduce, x,
           op=dist._make_nccl_premul_sum(2.0))
    expect(ValueError, "split_sizes", dist.all_to_all_single, torch.empty(6), x,
           [1] * WORLD, [1] * WORLD)
    expect(Exception, "any source", dist.recv, torch.empty(2))
    expect(ValueError, "pg_options", dist.new_group, backend="ferrocomm", pg_options=3)
    y = torch.ones(6)
    dist.all_reduce(y)
    assert torch.equal(y, torch.full((6,), float(WORLD))), y
    dist.destroy_process_group()
    print("errors ok")


# Members of torch's ProcessGroup that ferrocomm's group leaves to torch's base class, which
# serves them for a Python process group: enum values, identity and naming, registration.
TORCH_OWN = {"BackendType", "CUSTOM", "GLOO", "MPI", "NCCL", "UCC", "UNDEFINED", "XCCL",
             "_device_types", "_get_backend_name", "_has_hooks", "_id", "_pybind11_conduit_v1_",
             "_register_backend", "_set_default_backend", "_set_group_desc", "_set_group_name",
             "bound_device_id", "boxed", "unbox", "rank", "size"}


def coalesced_all_gather():
    """dist.all_gather_coalesced on DEV's tensors, sync and async, against gloo."""
    for k, dt in enumerate((torch.float32, torch.int64)):
        ins = [data((3,), dt, 20 + k), data((2, 2), dt, 30 + k), data((0,), dt, 40 + k),
               data((1,), dt, 50 + k)]
        for async_op in (False, True):
            def agc(g, *xs, async_op=async_op):
                outs = [[torch.full_like(x, -7) for x in xs] for _ in range(WORLD)]
                fut = dist.all_gather_coalesced(outs, list(xs), group=g, async_op=async_op)
                if async_op:
                    fut.wait()
                return outs
            both(f"all_gather_coalesced {dt} async={async_op}", agc, *ins)
    expect(ValueError, "output_tensor_lists[0] has 1 tensors for 2 inputs",
           dist.all_gather_coalesced, [[torch.empty(2, device=DEV)]] * WORLD,
           [torch.ones(2, device=DEV), torch.ones(2, device=DEV)])


def sparse_all_reduce():
    """Sparse COO all_reduce on DEV's tensors against gloo (sum by index), and clear errors
    for what is not summed."""
    # Index 0 on every rank (summed), one index of each rank's own, values with a dense
    # dimension; the same on gloo.
    def sparse(shape_extra=0, dense=2):
        idx = torch.tensor([[0, RANK + 1], [1, 0]])
        val = torch.arange(2 * dense, dtype=torch.float32).view(2, dense) + RANK
        return torch.sparse_coo_tensor(idx, val, (WORLD + 1 + shape_extra, 2, dense)).to(DEV)

    mine, ref = sparse(), sparse().cpu()
    work = dist.all_reduce(mine, async_op=True)
    work.wait()
    dist.all_reduce(ref, group=GLOO)
    same("sparse all_reduce", mine.to_dense().cpu(), ref.to_dense())
    assert mine.is_sparse
    empty = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 2),
                                    (WORLD + 1, 2, 2)).to(DEV)
    part = sparse() if RANK == 0 else empty
    ref = part.cpu()
    dist.all_reduce(part)
    dist.all_reduce(ref, group=GLOO)
    same("sparse all_reduce, empty on some ranks", part.to_dense().cpu(), ref.to_dense())
    expect(ferrocomm.FerrocommUnsupported, "sums (ReduceOp.SUM)", dist.all_reduce, sparse(),
           op=dist.ReduceOp.MAX)
    expect(ValueError, "differs", dist.all_reduce, sparse(shape_extra=RANK))
    expect(ValueError, "torch.sparse_coo tensor", dist.broadcast, sparse(), 0)
    expect(ValueError, "torch.sparse_coo tensor", dist.all_gather,
           [torch.empty(2, device=DEV) for _ in range(WORLD)], sparse())
    expect(ferrocomm.FerrocommUnsupported, "torch.sparse_csr", dist.all_reduce,
           torch.eye(3, device=DEV).to_sparse_csr())


def scenario_gaps():
    """What torch's own suite found missing: all_gather_coalesced (sync and async, against
    gloo), sparse all_reduce (against gloo) and clear errors for other sparse calls, every
    member of torch's ProcessGroup either ferrocomm's, torch's own, or FerrocommUnsupported
    naming the call, coalescing blocks, and a barrier's timeout in torch's words."""
    init()
    pg = dist.group.WORLD
    coalesced_all_gather()
    sparse_all_reduce()

    # Every member of torch's ProcessGroup is accounted for.
    own = set(vars(fct.ProcessGroupFerrocomm))
    members = {m for m in dir(dist.ProcessGroup) if not m.startswith("__")}
    unknown = sorted(members - own - TORCH_OWN)
    assert not unknown, f"torch's ProcessGroup members ferrocomm does not handle: {unknown}"
    t = torch.ones(2)
    unsupported = {
        "monitored_barrier": (), "split_group": ([0],),
        "merge_remote_group": (pg.get_group_store(), 1, datetime.timedelta(seconds=1)),
        "_register_on_completion_hook": (print,), "_wait_for_pending_works": (),
        "_enable_collectives_timing": (), "_set_sequence_number_for_group": (),
        "_get_sequence_number_for_group": (),
        "_backend_id": (dist.ProcessGroup.BackendType.CUSTOM,), "recv_anysource": ([t], 0)}
    for name, args in unsupported.items():
        assert name in own, name
        needle = "recv from any source" if name == "recv_anysource" else name
        expect(ferrocomm.FerrocommUnsupported, needle, getattr(pg, name), *args)
    for name in ("boxed", "rank", "size", "_get_backend_name", "_has_hooks", "_id"):
        getattr(pg, name)()
    assert pg._get_backend_name() == "ferrocomm"
    # What ferrocomm's group serves itself.
    store = pg.get_group_store()
    store.set(f"gaps/{RANK}", "x")
    assert store.get(f"gaps/{(RANK + 1) % WORLD}") == b"x"
    assert pg._get_backend(torch.device("cpu")) is pg and not pg.supports_splitting
    expect(ValueError, "no backend for device type meta", pg._get_backend, torch.device("meta"))
    pg.eager_connect_single_device(torch.device("cpu"))
    pg.set_timeout(datetime.timedelta(seconds=45))
    assert pg.comm("cpu").get_timeout() == datetime.timedelta(seconds=45)
    expect(ValueError, "positive timedelta", pg.set_timeout, 3)
    # A coalescing block of sends and receives (a ring), issued together at its end.
    got = torch.zeros(3)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.isend(torch.full((3,), float(RANK)), (RANK + 1) % WORLD)
        dist.irecv(got, (RANK - 1) % WORLD)
    cm.wait()
    same("coalesced ring", got, torch.full((3,), float((RANK - 1) % WORLD)))

    # A barrier that times out says so as torch's tooling reads it; the others wait on gloo
    # until rank 0 has seen it.
    short = dist.new_group(backend="ferrocomm", timeout=datetime.timedelta(seconds=1))
    if RANK == 0:
        t0 = time.monotonic()
        e = expect(ferrocomm.FerrocommTimeout, "Timed out", dist.barrier, group=short)
        assert re.search(" (Timed out|closed|timeout) ", str(e)), e
        assert time.monotonic() - t0 >= 0.9, time.monotonic() - t0
    dist.barrier(group=GLOO)
    y = torch.ones(4)
    dist.all_reduce(y)
    assert torch.equal(y, torch.full((4,), float(WORLD))), y
    dist.destroy_process_group()
    print("gaps ok")


def main():
    scenario = sys.argv[1]
    # Never hang silently: print every thread's stack and exit.
    faulthandler.dump_traceback_later(float(os.environ.get("FERROCOMM_TEST_WATCHDOG_S", "150")),
                                      exit=True)
    rank_scenario.run(RANK, scenario, globals()["scenario_" + scenario])


if __name__ == "__main__":
    main()

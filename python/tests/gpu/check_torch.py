"""GPU check of the Python API against torch.distributed (NCCL) on the same inputs.

    torchrun --nproc_per_node 2 python/tests/gpu/check_torch.py

Every method of the ferrocomm communicators ("ferrocomm" = cuda backend, and "nccl") runs on
the same random inputs as torch.distributed, for several dtypes and sizes (odd counts
included); then CUDA-graph capture and replay, two communicators interleaved, async work,
low precision and forced algorithms. Prints a summary; exits 1 on any mismatch.
"""

import faulthandler
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import ferrocomm
from ferrocomm import ReduceOp

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
DEV = torch.device("cuda", LOCAL)

RESULTS = {"pass": 0, "fail": 0, "skipped": 0}
# Comma-separated name prefixes of checks not to run (reported as skipped, never as passed).
SKIP = [p for p in os.environ.get("CHECK_SKIP", "").split(",") if p]
VERBOSE = bool(os.environ.get("CHECK_VERBOSE"))
# Never hang silently: dump every thread's Python stack if the script runs this long.
faulthandler.dump_traceback_later(int(os.environ.get("CHECK_WATCHDOG_S", "240")), repeat=True)
FAILURES = []

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
SIZES = [1, 1000, 4099, 262147, 1 << 21]


def log(msg):
    if RANK == 0:
        print(msg, flush=True)


def record(name, ok, detail=""):
    # Every rank must agree that a check passed.
    flag = torch.tensor([0 if ok else 1], device=DEV)
    dist.all_reduce(flag)
    if flag.item() == 0:
        RESULTS["pass"] += 1
    else:
        RESULTS["fail"] += 1
        FAILURES.append(f"{name}: {detail}" if detail else name)
        log(f"FAIL {name} {detail}")


def check(name, fn):
    if any(name.startswith(p) for p in SKIP):
        RESULTS["skipped"] += 1
        log(f"SKIPPED {name}")
        return
    if VERBOSE:
        print(f"[rank {RANK}] {name}", flush=True)
    t = time.time()
    try:
        ok, detail = fn()
    except Exception as e:  # a raise is a failure, reported with the message
        ok, detail = False, f"raised {type(e).__name__}: {e}"
        if os.environ.get("CHECK_TRACEBACK"):
            traceback.print_exc()
    if time.time() - t > 10:
        detail = f"{detail} (took {time.time() - t:.1f} s)"
    record(name, ok, detail)


def rand(n, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed * 131 + RANK)
    if dtype.is_floating_point and dtype not in FP8:
        return torch.randn(n, device=DEV, generator=g).to(dtype)
    if dtype in FP8:
        return (torch.randn(n, device=DEV, generator=g) * 4).to(dtype)
    lo, hi = (0, 9) if dtype == torch.uint8 else (-9, 10)
    return torch.randint(lo, hi, (n,), device=DEV, generator=g, dtype=dtype)


def poison(t):
    if t.dtype in FP8:
        t.view(torch.uint8).fill_(0x7E)
    elif t.dtype.is_floating_point:
        t.fill_(-777.25)
    else:
        t.fill_(77)
    return t


def same(a, b, dtype, op="sum"):
    """Compares ferrocomm's result `a` with NCCL's `b`: exact for ints, fp8, copies and
    min/max; within the reduction-order tolerance for float sums."""
    torch.cuda.synchronize()
    if dtype in FP8 or not dtype.is_floating_point or op in ("copy", "min", "max"):
        ok = torch.equal(a.view(torch.uint8) if dtype in FP8 else a,
                         b.view(torch.uint8) if dtype in FP8 else b)
        if ok:
            return True, ""
        bad = (a.view(torch.uint8) != b.view(torch.uint8)) if dtype in FP8 else (a != b)
        i = bad.nonzero()[:4].flatten().tolist()
        return False, f"{int(bad.sum())} differ, first at {i}"
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 4e-3,
           torch.bfloat16: 3e-2}[dtype] * max(WORLD, 2)
    if op == "product":
        tol *= 4
    d = (a.double() - b.double()).abs()
    scale = b.double().abs().clamp(min=1.0)
    err = (d / scale).max().item() if d.numel() else 0.0
    return err <= tol, f"max rel err {err:.3g} > {tol:.3g}" if err > tol else ""


DIST_OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
FC_OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
          "max": ReduceOp.MAX, "avg": ReduceOp.AVG}


def ops_for(dtype):
    if dtype.is_floating_point:
        return ["sum", "product", "min", "max", "avg"]
    return ["sum", "min", "max"]


def torch_ring(t, nxt, prv):
    """What torch.distributed receives from `prv` while sending `t` to `nxt` (fp8 as bytes)."""
    src = t.view(torch.uint8) if t.dtype in FP8 else t
    ref = torch.empty_like(src)
    ops = [dist.P2POp(dist.isend, src, nxt), dist.P2POp(dist.irecv, ref, prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    return ref


def check_methods(comm, tag):
    seed = 0
    for dtype in FLOATS + INTS:
        for n in SIZES:
            if n > 4099 and dtype not in (torch.float32, torch.bfloat16):
                continue
            seed += 1
            x = rand(n * WORLD, dtype, seed)
            dn = f"{tag} {str(dtype)[6:]} n={n}"
            for op in ops_for(dtype):
                if op == "product" and n > 4099:
                    continue
                xin = x if op != "product" else (x.float() * 0.01 + 1).to(dtype)

                def ar(xin=xin, op=op):
                    a, b = xin.clone(), xin.clone()
                    comm.all_reduce(a, FC_OPS[op])
                    dist.all_reduce(b, DIST_OPS[op])
                    return same(a, b, dtype, op)
                check(f"all_reduce {op} {dn}", ar)

                def red(xin=xin, op=op):
                    root = WORLD - 1
                    a, b = xin.clone(), xin.clone()
                    comm.reduce(a, root, FC_OPS[op])
                    dist.reduce(b, root, DIST_OPS[op])
                    return same(a, b, dtype, op) if RANK == root else same(a, xin, dtype, "copy")
                if op in ("sum", "max"):
                    check(f"reduce {op} {dn}", red)

                def rs(xin=xin, op=op):
                    a = poison(torch.empty(n, dtype=dtype, device=DEV))
                    b = torch.empty(n, dtype=dtype, device=DEV)
                    comm.reduce_scatter_single(a, xin, FC_OPS[op])
                    dist.reduce_scatter_tensor(b, xin, DIST_OPS[op])
                    ok1 = same(a, b, dtype, op)
                    la = poison(torch.empty(n, dtype=dtype, device=DEV))
                    comm.reduce_scatter(la, list(xin.chunk(WORLD)), FC_OPS[op])
                    ok2 = same(la, b, dtype, op)
                    return (ok1[0] and ok2[0], ok1[1] + ok2[1])
                if op in ("sum", "max", "avg"):
                    check(f"reduce_scatter {op} {dn}", rs)

            if dtype.is_floating_point:
                def pm(x=x):
                    a, b = x.clone(), (x.double() * 0.375)
                    comm.all_reduce(a, ReduceOp.PREMUL_SUM(0.375))
                    dist.all_reduce(b)
                    return same(a, b.to(dtype), dtype)
                check(f"all_reduce premul_sum {dn}", pm)

            def bc(x=x):
                a, b = x.clone(), x.clone()
                comm.broadcast(a, 0)
                dist.broadcast(b, 0)
                return same(a, b, dtype, "copy")
            check(f"broadcast {dn}", bc)

            def ag(x=x):
                inp = x[:n].contiguous()
                a = poison(torch.empty(n * WORLD, dtype=dtype, device=DEV))
                b = torch.empty(n * WORLD, dtype=dtype, device=DEV)
                comm.all_gather_single(a, inp)
                dist.all_gather_into_tensor(b, inp)
                lst = [poison(torch.empty(n, dtype=dtype, device=DEV)) for _ in range(WORLD)]
                comm.all_gather(lst, inp)
                ok1 = same(a, b, dtype, "copy")
                ok2 = same(torch.cat(lst), b, dtype, "copy")
                return ok1[0] and ok2[0], ok1[1] + ok2[1]
            check(f"all_gather {dn}", ag)

            def a2a(x=x):
                a = poison(torch.empty_like(x))
                b = torch.empty_like(x)
                comm.all_to_all_single(a, x)
                dist.all_to_all_single(b, x)
                return same(a, b, dtype, "copy")
            check(f"all_to_all_single {dn}", a2a)
    # Uneven all-to-all and lists, send/recv, barrier; fp8 data movement.
    for dtype in [torch.float32, torch.bfloat16, torch.int64] + FP8:
        seed += 1
        dn = f"{tag} {str(dtype)[6:]}"
        in_rows = [RANK + d + 1 for d in range(WORLD)]
        out_rows = [s + RANK + 1 for s in range(WORLD)]
        x = rand(sum(in_rows) * 3, dtype, seed).view(-1, 3)

        def a2av(x=x):
            a = poison(torch.empty(sum(out_rows), 3, dtype=dtype, device=DEV))
            b = torch.empty(sum(out_rows), 3, dtype=dtype, device=DEV)
            comm.all_to_all_v_single(a, x, out_rows, in_rows)
            xs, bs = (x.view(torch.uint8), b.view(torch.uint8)) if dtype in FP8 else (x, b)
            dist.all_to_all_single(bs, xs, out_rows, in_rows)
            return same(a, b, dtype, "copy")
        check(f"all_to_all_single splits {dn}", a2av)

        def a2al(x=x):
            ins = list(x.view(-1).split([r * 3 for r in in_rows]))
            outs = [poison(torch.empty(r * 3, dtype=dtype, device=DEV)) for r in out_rows]
            ref = [torch.empty(r * 3, dtype=torch.uint8 if dtype in FP8 else dtype,
                               device=DEV) for r in out_rows]
            comm.all_to_all(outs, ins)
            dist.all_to_all(ref, [t.view(torch.uint8) if dtype in FP8 else t for t in ins])
            if dtype in FP8:  # torch.cat may lack fp8 kernels: compare bytes
                return same(torch.cat([o.view(torch.uint8) for o in outs]), torch.cat(ref),
                            torch.uint8, "copy")
            return same(torch.cat(outs), torch.cat(ref), dtype, "copy")
        check(f"all_to_all lists {dn}", a2al)

        # Every rank's x above has its own length (uneven splits): point-to-point and fp8
        # broadcast/all-gather need the same count on every rank.
        even = rand(1001, dtype, seed + 500)

        def sr(x=even):
            t = x.contiguous()
            got = poison(torch.empty_like(t))
            nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
            if RANK % 2 == 0:
                comm.send(t, nxt)
                comm.recv(got, prv)
            else:
                comm.recv(got, prv)
                comm.send(t, nxt)
            return same(got, torch_ring(t, nxt, prv).view(dtype), dtype, "copy")
        check(f"send/recv {dn}", sr)

        def batch(x=even):
            # Every rank sends before it receives, in one batch (torchcomms' BatchSendRecv).
            t = x.contiguous()
            got = poison(torch.empty_like(t))
            nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
            b = comm.batch_op_create()
            b.send(t, nxt)
            b.recv(got, prv)
            b.issue()
            return same(got, torch_ring(t, nxt, prv).view(dtype), dtype, "copy")
        check(f"batch send/recv {dn}", batch)

        if dtype in FP8:
            def fp8(x=even):
                t = x.contiguous()
                a, b = t.clone(), t.clone().view(torch.uint8)
                comm.broadcast(a, 1 % WORLD)
                dist.broadcast(b, 1 % WORLD)
                g = poison(torch.empty(t.numel() * WORLD, dtype=dtype, device=DEV))
                comm.all_gather_single(g, t)
                gb = torch.empty(t.numel() * WORLD, dtype=torch.uint8, device=DEV)
                dist.all_gather_into_tensor(gb, t.view(torch.uint8))
                o1, o2 = same(a, b.view(dtype), dtype), same(g, gb.view(dtype), dtype)
                return o1[0] and o2[0], o1[1] + o2[1]
            check(f"fp8 broadcast/all_gather {dn}", fp8)

    def bar():
        comm.barrier()
        w = comm.barrier(async_op=True)
        w.wait_blocking()
        return True, ""
    check(f"barrier {tag}", bar)


def check_narrow(comm, tag):
    """bool reduces as torch.distributed reduces it over NCCL (sum = or, product = and); int16
    moves bit for bit (compared through a float16 view, which NCCL moves unchanged)."""
    n = 4099
    g = torch.Generator(device=DEV).manual_seed(4242 + RANK)
    b = torch.rand(n, device=DEV, generator=g) < 0.3
    for op in ("sum", "product", "max", "min"):
        def red(op=op):
            x, y = b.clone(), b.clone()
            comm.all_reduce(x, FC_OPS[op])
            dist.all_reduce(y, DIST_OPS[op])
            return same(x, y, torch.bool, "copy")
        check(f"all_reduce {op} {tag} bool", red)
    x16 = torch.randint(-30000, 30000, (n,), device=DEV, generator=g, dtype=torch.int16)

    def ag16():
        o = torch.full((n * WORLD,), 77, dtype=torch.int16, device=DEV)
        comm.all_gather_single(o, x16)
        r = torch.empty(n * WORLD, dtype=torch.float16, device=DEV)
        dist.all_gather_into_tensor(r, x16.view(torch.float16))
        return same(o, r.view(torch.int16), torch.int16, "copy")
    check(f"all_gather {tag} int16", ag16)

    def bc16():
        a, r = x16.clone(), x16.clone().view(torch.float16)
        comm.broadcast(a, WORLD - 1)
        dist.broadcast(r, WORLD - 1)
        return same(a, r.view(torch.int16), torch.int16, "copy")
    check(f"broadcast {tag} int16", bc16)


def check_graph(comm, tag):
    for dtype, n in [(torch.bfloat16, 4096), (torch.float32, 1 << 18), (torch.bfloat16, 1 << 20)]:
        dn = f"{tag} {str(dtype)[6:]} n={n}"

        def g(dtype=dtype, n=n):
            x = rand(n, dtype, 900)
            y = torch.empty(n * WORLD, dtype=dtype, device=DEV)
            s = torch.cuda.Stream(DEV)
            s.wait_stream(torch.cuda.current_stream(DEV))
            with torch.cuda.stream(s):
                for _ in range(2):  # warm-up outside capture (kernels compiled, buffers mapped)
                    comm.all_reduce(x.clone(), ReduceOp.SUM)
                    comm.all_gather_single(y, x)
            torch.cuda.current_stream(DEV).wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            work = x.clone()
            with torch.cuda.graph(graph):
                for _ in range(3):
                    comm.all_reduce(work, ReduceOp.SUM)
                comm.all_gather_single(y, work)
            errs = []
            for it in range(3):
                src = rand(n, dtype, 1000 + it)
                work.copy_(src)
                poison(y)
                graph.replay()
                ref = src.clone()
                for _ in range(3):
                    dist.all_reduce(ref)
                refy = torch.empty_like(y)
                dist.all_gather_into_tensor(refy, ref)
                ok1 = same(work, ref, dtype)
                ok2 = same(y, refy, dtype)
                if not (ok1[0] and ok2[0]):
                    errs.append(f"replay {it}: {ok1[1]} {ok2[1]}")
            return not errs, "; ".join(errs)
        check(f"cuda graph {dn}", g)


def check_async_and_two_comms(comm, comm2, tag):
    def asy():
        xs = [rand(100003, torch.float32, 50 + i) for i in range(4)]
        works = [comm.all_reduce(x, ReduceOp.SUM, async_op=True) for x in xs[:2]]
        works += [comm2.all_reduce(x, ReduceOp.MAX, async_op=True) for x in xs[2:]]
        for w in works:
            w.wait()
        refs = [rand(100003, torch.float32, 50 + i) for i in range(4)]
        for r in refs[:2]:
            dist.all_reduce(r)
        for r in refs[2:]:
            dist.all_reduce(r, dist.ReduceOp.MAX)
        works[0].wait_blocking()
        oks = [same(x, r, torch.float32, "sum" if i < 2 else "max")
               for i, (x, r) in enumerate(zip(xs, refs))]
        done = all(w.is_completed() for w in works[:1])
        return all(o[0] for o in oks) and done, " ".join(o[1] for o in oks)
    check(f"async + two communicators {tag}", asy)

    def side_stream():
        x = rand(65536, torch.bfloat16, 77)
        s = torch.cuda.Stream(DEV)
        s.wait_stream(torch.cuda.current_stream(DEV))
        with torch.cuda.stream(s):
            w = comm.all_reduce(x, ReduceOp.SUM, async_op=True)
        w.wait()  # current stream now ordered after the collective
        y = x * 1
        ref = rand(65536, torch.bfloat16, 77)
        dist.all_reduce(ref)
        return same(y, ref, torch.bfloat16)
    check(f"async on a side stream {tag}", side_stream)

    def many_in_flight():
        # More works alive at once than the native layer keeps events for, then waited in
        # reverse order, blocking with a bound, and dropped and reused.
        xs = [rand(4099, torch.float32, 900 + i) for i in range(150)]
        works = [comm.all_reduce(x, ReduceOp.SUM, async_op=True) for x in xs]
        for w in reversed(works):
            w.wait_blocking(timeout=60)
        done = all(w.is_completed() for w in works)
        del works
        ys = [rand(4099, torch.float32, 900 + i) for i in range(150)]
        for y in ys:
            comm.all_reduce(y, ReduceOp.SUM, async_op=True).wait()
        refs = [rand(4099, torch.float32, 900 + i) for i in range(150)]
        for r in refs:
            dist.all_reduce(r)
        oks = [same(x, r, torch.float32)[0] and same(y, r, torch.float32)[0]
               for x, y, r in zip(xs, ys, refs)]
        return all(oks) and done, f"{sum(oks)}/150 correct, all completed={done}"
    check(f"150 async works in flight {tag}", many_in_flight)


def check_hints(comm, tag):
    for fmt in ["e4m3", "e5m2", "int8"]:
        def lp(fmt=fmt):
            n = 1 << 20
            x = rand(n, torch.bfloat16, 300)
            a = x.clone()
            comm.all_reduce(a, ReduceOp.SUM, hints={"low_precision": fmt})
            ref = x.double()
            dist.all_reduce(ref)
            rel = ((a.double() - ref).norm() / ref.norm()).item()
            # Bit-identical on every rank (docs/design.md, rule 5).
            g = torch.empty(n * WORLD, dtype=torch.bfloat16, device=DEV)
            dist.all_gather_into_tensor(g, a)
            identical = all(torch.equal(c, g[:n]) for c in g.chunk(WORLD))
            limit = {"e4m3": 0.06, "e5m2": 0.12, "int8": 0.03}[fmt]
            return rel < limit and identical, f"rel L2 {rel:.4f} (limit {limit}), identical={identical}"
        check(f"low precision {fmt} {tag}", lp)
    for algo in ["flat", "tree"]:
        def fa(algo=algo):
            x = rand(1 << 16, torch.float32, 400)
            a, b = x.clone(), x.clone()
            comm.all_reduce(a, ReduceOp.SUM, hints={"algo": algo})
            dist.all_reduce(b)
            return same(a, b, torch.float32)
        check(f"algo {algo} {tag}", fa)


def check_errors(comm, tag):
    def errs():
        msgs = []
        cases = [
            ("not contiguous", lambda: comm.all_reduce(torch.ones(8, 8, device=DEV)[:, 0])),
            ("dtype mismatch", lambda: comm.all_gather_single(
                torch.empty(8 * WORLD, device=DEV), torch.ones(8, device=DEV,
                                                               dtype=torch.float16))),
            ("does not divide", lambda: comm.all_gather_single(
                torch.empty(8 * WORLD + 1, device=DEV), torch.ones(8, device=DEV))),
            ("is on cpu", lambda: comm.all_reduce(torch.ones(8))),
        ]
        for needle, f in cases:
            try:
                f()
                msgs.append(f"no error for {needle}")
            except ferrocomm.FerrocommValueError as e:
                if needle not in str(e):
                    msgs.append(f"{needle!r} not in {e}")
        return not msgs, "; ".join(msgs)
    check(f"errors {tag}", errs)


def main():
    torch.cuda.set_device(DEV)
    dist.init_process_group("nccl", device_id=DEV)
    t0 = time.time()
    comm = ferrocomm.new_comm("ferrocomm", "cuda", "check")
    log(f"ferrocomm communicator: {comm}")
    comm2 = ferrocomm.new_comm("ferrocomm", DEV, "check-second")
    check_methods(comm, "cuda")
    check_narrow(comm, "cuda")
    check_graph(comm, "cuda")
    check_async_and_two_comms(comm, comm2, "cuda")
    check_hints(comm, "cuda")
    check_errors(comm, "cuda")
    comm2.finalize()
    nccl = None
    try:
        nccl = ferrocomm.new_comm("nccl", "cuda", "check-nccl")
    except ferrocomm.FerrocommError as e:
        record("nccl backend creation", False, str(e))
    if nccl is not None:
        check_methods(nccl, "nccl")
        check_graph(nccl, "nccl")
        nccl.finalize()
    with ferrocomm.new_comm("ferrocomm", "cuda", "check-ctx") as c3:
        def ctx():
            x = rand(333, torch.float32, 5)
            b = x.clone()
            c3.all_reduce(x, ReduceOp.SUM)
            dist.all_reduce(b)
            return same(x, b, torch.float32)
        check("context-manager communicator", ctx)
    comm.finalize()
    torch.cuda.synchronize()
    log(f"\nsummary: {RESULTS['pass']} passed, {RESULTS['fail']} failed, "
        f"{RESULTS['skipped']} skipped "
        f"({time.time() - t0:.1f} s, {WORLD} ranks)")
    for f in FAILURES:
        log(f"  FAILED {f}")
    dist.destroy_process_group()
    sys.exit(1 if RESULTS["fail"] else 0)


if __name__ == "__main__":
    main()

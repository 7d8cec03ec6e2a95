"""GPU check of ``Comm.all_reduce_rmsnorm`` on CUDA tensors (the fused all-reduce + residual add
+ RMSNorm, FP8 rows included).

    ferrocomm launch -n 2 -- python3 python/tests/gpu/check_rmsnorm.py [--share-gpus]

(torchrun works too; ``--share-gpus`` as in check_dynamic.py: every rank on GPU ``LOCAL_RANK
mod count``, NCCL not loaded, correctness only.) Every rank builds every rank's inputs from the
same seeds and checks against a float64 reference of its own: float32, bfloat16 and float16
rows of the model hidden sizes with odd row counts, in and out of place, the FP8 rows
dequantized within E4M3's error, identical results on every rank, ``async_op``, a CUDA graph
replayed with new inputs, and the errors for bad arguments. Prints a summary; exits 1 on any
mismatch.
"""

import torch

import ferrocomm
from shared_check import DEV, RANK, WORLD, captured, expect_errors, finish, record

U = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def rand(shape, dtype, seed, owner):
    g = torch.Generator(device=DEV).manual_seed(seed * 7919 + owner)
    return (torch.rand(shape, device=DEV, generator=g, dtype=torch.float64) * 6 - 3).to(dtype)


def inputs(dtype, rows, hidden, seed):
    xs = [rand((rows, hidden), dtype, seed, r) for r in range(WORLD)]
    res = rand((rows, hidden), dtype, seed, 1000)
    w = rand((hidden,), dtype, seed, 1001)
    return xs, res, w


def check(name, dtype, xs, res, w, eps, got, fp8=None):
    """`got` = (out, residual_out) against the float64 reference (the bounds of
    ferrocomm.rmsnorm::compare: the sum and r rounded once each, y through r and the norm)."""
    out, r_out = (t.double() for t in got)
    s = sum(x.double() for x in xs)
    r = s + res.double()
    inv = torch.rsqrt((r * r).mean(-1, keepdim=True) + eps)
    y = r * inv * w.double()
    u = U[dtype]
    smax = s.abs().amax(-1, keepdim=True)
    rmax = r.abs().amax(-1, keepdim=True)
    ymax = y.abs().amax(-1, keepdim=True)
    tol_r = u * (s.abs() + r.abs()) + 2.0 ** -20 * (smax + rmax)
    ok_r = bool(((r_out - r).abs() <= tol_r).all())
    rn = r.norm(dim=-1, keepdim=True)
    rel_inv = u * (s.norm(dim=-1, keepdim=True) + rn) / rn.clamp_min(1e-300)
    tol_y = inv * w.double().abs() * tol_r + y.abs() * (rel_inv + 3 * u) + 2.0 ** -20 * ymax
    ok_y = bool(((out - y).abs() <= tol_y).all())
    record(f"{name} residual", ok_r, f"max err {(r_out - r).abs().max().item():.3g}")
    record(f"{name} out", ok_y, f"max err {(out - y).abs().max().item():.3g}")
    if fp8 is not None:
        codes, scales = fp8
        ok_shape = codes.dtype == torch.float8_e4m3fn and tuple(scales.shape) == (y.shape[0], 1)
        deq = codes.double() * scales.double()
        ytol = tol_y.amax(-1, keepdim=True)
        bound = (y.abs() + ytol) * 2.0 ** -4 + scales.double() * 2.0 ** -10 + ytol
        ok = ok_shape and bool(((deq - y).abs() <= bound).all())
        record(f"{name} fp8", ok, f"max err {(deq - y).abs().max().item():.3g}")


def same_everywhere(comm, name, tensors):
    """Every rank's bytes of `tensors` equal rank 0's."""
    mine = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    every = torch.empty(WORLD * mine.numel(), dtype=torch.uint8, device=DEV)
    comm.all_gather_single(every, mine)
    every = every.view(WORLD, -1)
    record(f"{name} identical on every rank", bool((every == every[0]).all()))


def eager(comm):
    seed = 0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, hidden in ((1, 8), (3, 4096), (1, 5120), (5, 8192), (3, 16384), (129, 4096)):
            for in_place in (True, False):
                seed += 1
                quant = "e4m3" if seed % 2 else None
                xs, res, w = inputs(dtype, rows, hidden, seed)
                x, r = xs[RANK].clone(), res.clone()
                kw = {} if in_place else dict(out=torch.empty_like(x),
                                               residual_out=torch.empty_like(r))
                got = comm.all_reduce_rmsnorm(x, r, w, 1e-6, quant=quant, **kw)
                torch.cuda.synchronize(DEV)
                name = f"{dtype} {rows}x{hidden} {'in place' if in_place else 'out'} {quant}"
                if in_place:
                    record(f"{name} in place", got[0] is x and got[1] is r)
                else:
                    record(f"{name} inputs kept", torch.equal(x, xs[RANK]) and torch.equal(r, res))
                check(name, dtype, xs, res, w, 1e-6, got[:2], got[2:] if quant else None)
                same_everywhere(comm, name, got)
    # async_op: result() once waited.
    xs, res, w = inputs(torch.bfloat16, 4, 1024, 77)
    work = comm.all_reduce_rmsnorm(xs[RANK].clone(), res.clone(), w, 1e-5, async_op=True)
    work.wait()
    check("async", torch.bfloat16, xs, res, w, 1e-5, work.result())


def graph(comm):
    dtype, rows, hidden = torch.bfloat16, 3, 4096
    x = torch.empty(rows, hidden, dtype=dtype, device=DEV)
    res = torch.empty_like(x)
    w = torch.empty(hidden, dtype=dtype, device=DEV)
    out, r_out = torch.empty_like(x), torch.empty_like(x)
    holder = {}

    def body():
        holder["got"] = comm.all_reduce_rmsnorm(x, res, w, 1e-6, out=out, residual_out=r_out,
                                                quant="e4m3")

    def load(seed):
        xs, rs, ws = inputs(dtype, rows, hidden, seed)
        x.copy_(xs[RANK])
        res.copy_(rs)
        w.copy_(ws)
        return xs, rs, ws

    load(500)
    g = captured(body)
    for replay in range(3):
        xs, rs, ws = load(600 + replay)
        out.fill_(float("nan"))
        r_out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(DEV)
        got = holder["got"]
        check(f"graph replay {replay}", dtype, xs, rs, ws, 1e-6, (out, r_out), got[2:])


def errors(comm):
    x = torch.ones(2, 16, dtype=torch.bfloat16, device=DEV)
    r = torch.ones_like(x)
    w = torch.ones(16, dtype=torch.bfloat16, device=DEV)
    expect_errors([
        ("multiple of 8", lambda: comm.all_reduce_rmsnorm(
            torch.ones(2, 12, dtype=torch.bfloat16, device=DEV),
            torch.ones(2, 12, dtype=torch.bfloat16, device=DEV),
            torch.ones(12, dtype=torch.bfloat16, device=DEV), 1e-6)),
        ("weight has shape (8,)", lambda: comm.all_reduce_rmsnorm(x, r, w[:8], 1e-6)),
        ("residual is float16",
         lambda: comm.all_reduce_rmsnorm(x, r.half(), w, 1e-6)),
        ("quant must be None or 'e4m3'", lambda: comm.all_reduce_rmsnorm(x, r, w, 1e-6,
                                                                         quant="e5m2")),
    ])


def main():
    torch.cuda.set_device(DEV)
    comm = ferrocomm.new_comm("ferrocomm", DEV, "check-rmsnorm")
    if RANK == 0:
        print(f"check_rmsnorm: {WORLD} ranks, backend {comm.get_backend()}", flush=True)
    eager(comm)
    graph(comm)
    errors(comm)
    finish(comm)


if __name__ == "__main__":
    main()

"""all_reduce_rmsnorm on the host backend, one rank of a multi-process run (ranks.py's
``rmsnorm`` scenario): results against a float64 numpy reference, bit-identical rows on every
rank (compared through an all_gather), FP8 rows within E4M3's error (a scale per row, or one
given scale, saturating), bad inputs refused."""

import numpy as np

import ferrocomm
from ferrocomm import FerrocommValueError

U = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
E4M3_MAX = 448.0


def inputs(dtype, rows, hidden, rank, seed):
    rng = np.random.default_rng([seed, rank])
    x = rng.uniform(-3, 3, (rows, hidden))
    rr = np.random.default_rng([seed, 1000])
    return x, rr.uniform(-3, 3, (rows, hidden)), rr.uniform(0.5, 1.5, hidden)


def as_dtype(a, dtype):
    """(buffer to pass, its values as float64) for a float64 array."""
    if dtype == "bfloat16":
        import torch

        t = torch.tensor(a, dtype=torch.float64).to(torch.bfloat16)
        return t, t.to(torch.float64).numpy()
    b = a.astype(dtype)
    return b, b.astype(np.float64)


def values(buf):
    if isinstance(buf, np.ndarray):
        return buf.astype(np.float64)
    import torch

    return buf.to(torch.float64).numpy()


def e4m3_values(codes):
    """Decoded E4M3 codes (uint8 numpy or torch float8_e4m3fn)."""
    if not isinstance(codes, np.ndarray):
        import torch

        return codes.to(torch.float64).numpy()
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return sign * v


def check_case(comm, rank, world, dtype, rows, hidden, eps, in_place, quant, seed, scale=None):
    xs = [inputs(dtype, rows, hidden, r, seed)[0] for r in range(world)]
    _, res64, w64 = inputs(dtype, rows, hidden, 0, seed)
    xq = [as_dtype(x, dtype) for x in xs]
    res, res_v = as_dtype(res64, dtype)
    w, w_v = as_dtype(w64, dtype)
    x = xq[rank][0]
    s_ref = sum(v for _, v in xq)
    r_ref = s_ref + res_v
    inv = 1 / np.sqrt((r_ref ** 2).mean(-1, keepdims=True) + eps)
    y_ref = r_ref * inv * w_v
    kw = {}
    if not in_place:
        kw = dict(out=_empty_like(x), residual_out=_empty_like(res))
    x_before, res_before = values(x).copy(), values(res).copy()
    if scale is not None:
        kw["scale"] = scale
    got = comm.all_reduce_rmsnorm(x, res, w, eps, quant="e4m3" if quant else None, **kw)
    out, res_out = got[0], got[1]
    if in_place:
        assert out is x and res_out is res
    else:
        assert np.array_equal(values(x), x_before) and np.array_equal(values(res), res_before)
    u = U[dtype]
    label = f"{dtype} {rows}x{hidden} eps={eps} in_place={in_place} quant={quant} scale={scale}"
    # Bounds: the sum and r rounded once each (f32 noise aside); y feels that through r and
    # through the row's norm, and is rounded itself.
    smax = np.abs(s_ref).max(-1, keepdims=True)
    rmax = np.abs(r_ref).max(-1, keepdims=True)
    ymax = np.abs(y_ref).max(-1, keepdims=True)
    tol_r = u * (np.abs(s_ref) + np.abs(r_ref)) + 2.0 ** -20 * (smax + rmax)
    err_r = np.abs(values(res_out) - r_ref) - tol_r
    assert (err_r <= 0).all(), f"{label}: residual_out off by {err_r.max()} past the bound"
    rn = np.linalg.norm(r_ref, axis=-1, keepdims=True)
    rel_inv = u * (np.linalg.norm(s_ref, axis=-1, keepdims=True) + rn) / np.maximum(rn, 1e-300)
    tol_y = inv * np.abs(w_v) * tol_r + np.abs(y_ref) * (rel_inv + 3 * u) + 2.0 ** -20 * ymax
    err_y = np.abs(values(out) - y_ref) - tol_y
    assert (err_y <= 0).all(), f"{label}: out off by {err_y.max()} past the bound"
    rows_of = [values(out), values(res_out)]
    if quant:
        codes, scales = got[2], got[3]
        ytol = tol_y.max(-1, keepdims=True)
        if scale is None:
            assert tuple(codes.shape) == (rows, hidden) and tuple(scales.shape) == (rows, 1)
            s = values(scales)
            assert (np.abs(s - ymax / E4M3_MAX) <= ytol / E4M3_MAX
                    + 2 * u * ymax / E4M3_MAX).all(), f"{label}: scales"
            want = y_ref
        else:
            # The given scale, returned as it was; codes saturate at 448 steps of it.
            assert tuple(codes.shape) == (rows, hidden) and values(scales).size == 1
            s = float(values(scales).ravel()[0])
            assert s == np.float32(scale), f"{label}: the given scale came back as {s}"
            want = np.clip(y_ref, -E4M3_MAX * s, E4M3_MAX * s)
        deq = e4m3_values(codes) * s
        bound = (np.abs(want) + ytol) * 2.0 ** -4 + s * 2.0 ** -10 + ytol
        assert (np.abs(deq - want) <= bound).all(), f"{label}: FP8 rows past E4M3's error"
        rows_of += [e4m3_values(codes), np.ravel(s)]
    # Bit-identical on every rank: gather every rank's results and compare with rank 0's.
    mine = np.concatenate([np.ravel(a) for a in rows_of])
    every = np.empty(world * mine.size)
    comm.all_gather_single(every, mine)
    every = every.reshape(world, -1)
    assert np.array_equal(every, np.broadcast_to(every[0], every.shape), equal_nan=True), \
        f"{label}: ranks differ"


def _empty_like(a):
    if isinstance(a, np.ndarray):
        return np.full_like(a, np.nan)
    return a.new_full(a.shape, float("nan"))


def check_refusals(comm, rank):
    x = np.ones((3, 16), np.float32)
    res = np.ones((3, 16), np.float32)
    w = np.ones(16, np.float32)
    cases = [
        (dict(weight=np.ones(12, np.float32), x=np.ones((3, 12), np.float32),
              residual=np.ones((3, 12), np.float32)), "multiple of 8"),
        (dict(weight=np.ones(8, np.float32)), "weight has shape (8,), expected (16,)"),
        (dict(residual=np.ones((2, 16), np.float32)), "residual has shape (2, 16)"),
        (dict(residual=np.ones((3, 16), np.float16)), "residual is float16, x is float32"),
        (dict(quant="int4"), "quant must be None or 'e4m3'"),
        (dict(scale=0.5), "pass quant='e4m3'"),
        (dict(quant="e4m3", scale="0.5"), "scale must be a number or a one-element"),
        (dict(quant="e4m3", scale=np.ones(2, np.float32)), "one float32 value, not 2"),
        (dict(quant="e4m3", scale=np.ones(1, np.float64)), "one float32 value, not 1 of float64"),
        (dict(x=np.ones((3, 16), np.int32), residual=np.ones((3, 16), np.int32),
              weight=np.ones(16, np.int32)), "are not supported"),
    ]
    for change, needle in cases:
        args = dict(x=x.copy(), residual=res.copy(), weight=w)
        args.update(change)
        before = [a.copy() for a in (args["x"], args["residual"])]
        quant = args.pop("quant", None)
        extra = {"scale": args.pop("scale")} if "scale" in args else {}
        try:
            comm.all_reduce_rmsnorm(args["x"], args["residual"], args["weight"], 1e-6,
                                    quant=quant, **extra)
        except FerrocommValueError as e:
            assert needle in str(e), f"{needle!r} not in {e}"
        else:
            raise AssertionError(f"no error for {change} ({needle})")
        assert np.array_equal(args["x"], before[0]) and np.array_equal(args["residual"], before[1])
    # Ranks that disagree on the hidden size fail together, nothing written.
    shape = (4, 16) if rank == 0 else (2, 32)
    xd, rd = np.ones(shape, np.float32), np.ones(shape, np.float32)
    try:
        comm.all_reduce_rmsnorm(xd, rd, np.ones(shape[1], np.float32), 1e-6)
    except FerrocommValueError as e:
        assert "ranks disagree on the call" in str(e), str(e)
    else:
        raise AssertionError("ranks that disagree were not refused")
    assert (xd == 1).all() and (rd == 1).all()


def run(comm, rank, world):
    # bfloat16 goes through torch tensors, which the test environment has (scripts/test.sh):
    # a missing torch fails here instead of leaving bf16 out.
    dtypes = ["float32", "float16", "bfloat16"]
    seed = 0
    for dtype in dtypes:
        for rows, hidden in [(1, 8), (3, 4096), (1, 5120), (5, 8192), (3, 16384)]:
            seed += 1
            check_case(comm, rank, world, dtype, rows, hidden, 1e-6, seed % 2 == 0,
                       seed % 3 != 0, seed)
        for eps in (0.0, 0.25):
            for in_place in (True, False):
                for quant in (False, True):
                    seed += 1
                    check_case(comm, rank, world, dtype, 7, 40, eps, in_place, quant, seed)
        # One given scale: a number, and a one-element float32 array (saturating at 0.002).
        for scale in (0.02, np.full(1, 0.002, np.float32)):
            seed += 1
            check_case(comm, rank, world, dtype, 5, 64, 1e-6, seed % 2 == 0, True, seed,
                       scale=scale)
    # async_op: the outputs come from result() once waited.
    x, res, w = (np.ones((2, 8), np.float32) * (rank + 1), np.ones((2, 8), np.float32),
                 np.ones(8, np.float32))
    work = comm.all_reduce_rmsnorm(x, res, w, 0.0, async_op=True)
    work.wait()
    out, res_out = work.result()
    want = world * (world + 1) / 2 + 1
    assert (res_out == want).all() and np.allclose(out, 1.0), (out, res_out)
    # The module-level form takes the communicator as its group.
    x = np.ones((2, 8), np.float32)
    out, res_out = ferrocomm.all_reduce_rmsnorm(x, np.zeros((2, 8), np.float32), w, 0.0,
                                                group=comm)
    assert (res_out == world).all() and np.allclose(out, 1.0)
    check_refusals(comm, rank)
    print(f"rmsnorm ok ({', '.join(dtypes)})")

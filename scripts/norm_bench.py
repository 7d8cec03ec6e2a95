#!/usr/bin/env python3
"""The local half of the fused all-reduce + residual add + RMSNorm on one GPU: ferrocomm's
``all_reduce_rmsnorm`` on a communicator of one rank (the residual add, the norm and the writes
every rank does) against ``torch.compile`` of the same three steps, and the one-launch kernels of
two ranks run on this GPU alone with their peer reads pointed at local memory.

    python3 scripts/norm_bench.py OUTDIR [--quick] [--hidden 4096,8192] [--dtype bfloat16]
    python3 scripts/norm_bench.py OUTDIR --profile     (a few eager calls, for ncu)

Every row is checked first (poisoned outputs, random inputs, against the float64 reference of
the three steps), then timed: a CUDA graph of 20 in-place calls (``x`` becomes ``y``, the
residual ``r``), replayed after a warm-up, CUDA events around each replay, the median of the
replays divided by 20. The compiled baseline is

    r = x + residual; residual.copy_(r); x.copy_(rms_norm(r.float(), w).to(dtype))

compiled for each shape (static shapes) and timed the same way in the same run. Effective
bandwidth counts the bytes the call must move: x and the residual read, ``out`` and
``residual_out`` written (4 x rows x hidden elements; the weight is negligible).

The loopback rows (``FERROCOMM_RMSNORM_LOOPBACK=2``) run the two-rank one-shot (``flat``) and
two-shot (``tree``) kernels on this GPU as a rank whose peer is itself: no barrier, every read of
the peer's staging a read of local memory. Their bandwidth counts the local traffic of one rank
of a two-rank call: one-shot 7 x rows x hidden elements (x read and staged, both staged copies
read, the residual read, two outputs written), two-shot 7.5 (everything staged, half the rows
reduced and published, the other half copied back). Their results are not the call's and are
not checked.

Writes OUTDIR/norm_bench.md (the tables), norm_bench.json and norm_bench.png (with matplotlib).
"""

import argparse
import json
import os
import socket
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import ferrocomm

CALLS = 20  # calls per graph
EPS = 1e-6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows_list(quick):
    if quick:
        return [1, 64, 512, 4096]
    return [1 << k for k in range(15)]  # 1 .. 16384


def compiled_step():
    # One compile per shape (static shapes, the compiler's best case): more than its default
    # limit of recompiles.
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    def step(x, residual, w):
        r = x + residual
        residual.copy_(r)
        x.copy_(torch.nn.functional.rms_norm(r.float(), (r.shape[-1],), w.float(), EPS).to(x.dtype))

    return torch.compile(step, dynamic=False, fullgraph=True)


def graph_time(fn, replays, warm=3):
    """µs per call of `fn` (which issues CALLS calls): a CUDA graph replayed, events around each
    replay, the median."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up outside the capture (compiles, lazy loads)
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(warm):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return statistics.median(times), min(times), max(times)


def reference(x, residual, w):
    """The three steps in float64 of the rounded inputs: (r rounded to x's dtype, y)."""
    r = (x.double() + residual.double()).to(x.dtype).double()
    inv = torch.rsqrt((r * r).mean(-1, keepdim=True) + EPS)
    return r, r * inv * w.double()


def check(comm, x, residual, w):
    """ferrocomm's call against the float64 reference, outputs poisoned first; the largest
    error of y relative to the row's largest |y|, and of r."""
    out = torch.full_like(x, float("nan"))
    rout = torch.full_like(x, float("nan"))
    comm.all_reduce_rmsnorm(x, residual, w, EPS, out=out, residual_out=rout)
    torch.cuda.synchronize()
    r_ref, y_ref = reference(x, residual, w)
    if torch.isnan(out).any() or torch.isnan(rout).any():
        return float("inf"), float("inf")
    ey = ((out.double() - y_ref).abs().amax(-1) / y_ref.abs().amax(-1).clamp_min(1e-30)).max()
    er = ((rout.double() - r_ref).abs().amax(-1) / r_ref.abs().amax(-1).clamp_min(1e-30)).max()
    return float(ey), float(er)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--quick", action="store_true", help="four row counts instead of 15")
    ap.add_argument("--hidden", default="4096,8192")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--profile", action="store_true",
                    help="only a few eager calls of each kernel (to run under ncu)")
    ap.add_argument("--no-loopback", action="store_true")
    a = ap.parse_args()
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        sys.exit("norm_bench: no CUDA device")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dtype = getattr(torch, a.dtype)
    hiddens = [int(h) for h in a.hidden.split(",")]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    store = dist.distributed_c10d._get_default_store()
    os.environ.pop("FERROCOMM_RMSNORM_LOOPBACK", None)
    comm = ferrocomm.new_comm("ferrocomm", dev, "norm_bench", store=store, rank=0, size=1)
    loop = None
    if not a.no_loopback:
        # A staging that holds the largest two-shot call (x's rows and the published ones).
        os.environ["FERROCOMM_RMSNORM_LOOPBACK"] = "2"
        os.environ["FERROCOMM_CUDA_STAGING_BYTES"] = str(2 * max(rows_list(a.quick))
                                                         * max(hiddens) * 4)
        loop = ferrocomm.new_comm("ferrocomm", dev, "norm_bench_loopback", store=store, rank=0,
                                  size=1)
        del os.environ["FERROCOMM_RMSNORM_LOOPBACK"]
        del os.environ["FERROCOMM_CUDA_STAGING_BYTES"]
    torch.manual_seed(0)
    rows_all = [1, 4096] if a.profile else rows_list(a.quick)
    esize = torch.empty((), dtype=dtype).element_size()
    results = []
    for hidden in hiddens:
        w = torch.rand(hidden, device=dev, dtype=dtype) + 0.5
        step = compiled_step()
        for rows in rows_all:
            x = torch.randn(rows, hidden, device=dev, dtype=dtype)
            residual = torch.randn(rows, hidden, device=dev, dtype=dtype)
            ey, er = check(comm, x, residual, w)
            if a.profile:
                for c in (comm, loop):
                    if c is None:
                        continue
                    for algo in ("flat", "tree") if c is loop else (None,):
                        h = {"algo": algo} if algo else None
                        c.all_reduce_rmsnorm(x.clone(), residual.clone(), w, EPS, hints=h)
                xs, rs = x.clone(), residual.clone()
                step(xs, rs, w)
                torch.cuda.synchronize()
                continue
            xf, rf = x.clone(), residual.clone()
            fc = graph_time(lambda: [comm.all_reduce_rmsnorm(xf, rf, w, EPS)
                                     for _ in range(CALLS)], a.replays)
            xt, rt = x.clone(), residual.clone()
            tc = graph_time(lambda: [step(xt, rt, w) for _ in range(CALLS)], a.replays)
            row = {"hidden": hidden, "rows": rows, "dtype": a.dtype, "err_y": ey, "err_r": er,
                   "ferrocomm_us": fc[0], "ferrocomm_range": fc[1:],
                   "compiled_us": tc[0], "compiled_range": tc[1:]}
            nbytes = 4 * rows * hidden * esize
            row["ferrocomm_tbs"] = nbytes / fc[0] / 1e6
            row["compiled_tbs"] = nbytes / tc[0] / 1e6
            if loop is not None:
                for algo, units in (("flat", 7.0), ("tree", 7.5)):
                    xl, rl = x.clone(), residual.clone()
                    lt = graph_time(lambda: [loop.all_reduce_rmsnorm(xl, rl, w, EPS,
                                                                     hints={"algo": algo})
                                             for _ in range(CALLS)], a.replays)
                    row[f"loop_{algo}_us"] = lt[0]
                    row[f"loop_{algo}_tbs"] = units * rows * hidden * esize / lt[0] / 1e6
            results.append(row)
            print(f"{hidden} x {rows}: ferrocomm {fc[0]:.2f} µs, compiled {tc[0]:.2f} µs, "
                  f"ratio {fc[0] / tc[0]:.2f}, err y {ey:.1e} r {er:.1e}", flush=True)
    if a.profile:
        print("profile calls issued")
        return
    name = torch.cuda.get_device_name(dev)
    lines = [f"all_reduce_rmsnorm's local half, {a.dtype}, world size 1, {name}: µs per call in "
             f"a CUDA graph of {CALLS} calls (median of {a.replays} replays); effective TB/s over "
             f"4 x rows x hidden elements (ferrocomm {ferrocomm.__version__}, torch "
             f"{torch.__version__})", "",
             "| hidden x rows | ferrocomm µs | torch.compile µs | ratio | ferrocomm TB/s | "
             "compiled TB/s | max err y | max err r |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['hidden']} x {r['rows']} | {r['ferrocomm_us']:.2f} | "
                     f"{r['compiled_us']:.2f} | {r['ferrocomm_us'] / r['compiled_us']:.2f} | "
                     f"{r['ferrocomm_tbs']:.2f} | {r['compiled_tbs']:.2f} | {r['err_y']:.1e} | "
                     f"{r['err_r']:.1e} |")
    if loop is not None:
        lines += ["", "Two-rank one-launch kernels on this GPU alone (FERROCOMM_RMSNORM_LOOPBACK=2: "
                  "the peer's staging is local memory, no barrier): µs per call and local "
                  "traffic in TB/s (one-shot 7, two-shot 7.5 x rows x hidden elements), against "
                  "the world-1 call's TB/s", "",
                  "| hidden x rows | one-shot µs | one-shot TB/s | two-shot µs | two-shot TB/s | "
                  "one-shot / world 1 | two-shot / world 1 |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            lines.append(f"| {r['hidden']} x {r['rows']} | {r['loop_flat_us']:.2f} | "
                         f"{r['loop_flat_tbs']:.2f} | {r['loop_tree_us']:.2f} | "
                         f"{r['loop_tree_tbs']:.2f} | "
                         f"{r['loop_flat_tbs'] / r['ferrocomm_tbs']:.2f} | "
                         f"{r['loop_tree_tbs'] / r['ferrocomm_tbs']:.2f} |")
    table = "\n".join(lines)
    print(table)
    (out / "norm_bench.md").write_text(table + "\n")
    (out / "norm_bench.json").write_text(json.dumps({"device": name, "calls": CALLS,
                                                     "replays": a.replays, "rows": results},
                                                    indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
    else:
        fig, axes = plt.subplots(1, len(hiddens), figsize=(6 * len(hiddens), 4.5), squeeze=False)
        for ax, hidden in zip(axes[0], hiddens):
            rs = [r for r in results if r["hidden"] == hidden]
            xs = [r["rows"] for r in rs]
            ax.plot(xs, [r["ferrocomm_us"] for r in rs], "o-", label="ferrocomm (world 1)")
            ax.plot(xs, [r["compiled_us"] for r in rs], "s--", label="torch.compile")
            if loop is not None:
                ax.plot(xs, [r["loop_flat_us"] for r in rs], "^:", label="2-rank one-shot, loopback")
                ax.plot(xs, [r["loop_tree_us"] for r in rs], "v:", label="2-rank two-shot, loopback")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("rows")
            ax.set_ylabel("µs per call")
            ax.set_title(f"hidden {hidden}, {a.dtype}, {name}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "norm_bench.png", dpi=110)
    comm.finalize()
    if loop is not None:
        loop.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

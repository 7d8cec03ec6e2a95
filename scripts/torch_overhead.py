#!/usr/bin/env python3
"""Host time per call of a small all-reduce, one process (world size 1): a bare kernel launch,
torch.distributed over NCCL, ferrocomm's direct API and the "ferrocomm" torch.distributed
backend (sync, async, low-precision hints); and the direct API's sync call on two communicators
of their own, one with its flight recorder on (the default), one with it off
(FERROCOMM_FLIGHT_RECORDER=0): the recorder's cost is the median difference of many short
paired runs of these two (--pairs, --pair-calls), beside a control: a second communicator with
the recorder off, timed in the same steps (what two communicators differ by when nothing does).

    python3 scripts/torch_overhead.py OUTDIR [--calls 10000] [--bytes 1024] [--device cuda]

Every row issues the call in a loop after a warm-up and divides the loop's wall time by the
count; the GPU is synchronized before and after the loop, not inside it, so the figure is what
the host spends per call (the kernels run behind it). The `--calls` are split into `--rounds`
rounds with every row taking its turn in each round, and the table shows each row's median
round (a slow spell of the machine then moves every row alike) and the rounds' range.
`--device cpu` runs the same rows on CPU tensors (gloo instead of NCCL, ferrocomm's host backend), which is where
the Python path can be profiled without a GPU (`--profile` writes a cProfile listing of the
backend's all-reduce). Prints the table and writes overhead.md and overhead.json to OUTDIR.
"""

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ferrocomm
import ferrocomm.torch as fct


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, calls, cuda):
    """Host µs per call of `calls` back-to-back calls (warmed up, the GPU idle before)."""
    for _ in range(min(200, calls)):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    return dt / calls * 1e6


def measure(rows, calls, rounds, cuda):
    """Each row's median over `rounds` rounds of calls/rounds calls, the rows interleaved in
    every round (a slow spell of the machine then hits every row alike), and the spread."""
    per = max(1, calls // rounds)
    seen = [[] for _ in rows]
    for _ in range(rounds):
        for k, (_, fn) in enumerate(rows):
            seen[k].append(timed(fn, per, cuda))
    return [(statistics.median(v), min(v), max(v)) for v in seen], seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=10,
                    help="rounds the calls are split into, every row in each; the median is shown")
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=402,
                    help="pairs of runs (recorder on, recorder off) the recorder's cost is the "
                         "median difference of (with the control, three runs a step in six "
                         "orders: a multiple of 6 balances them)")
    ap.add_argument("--pair-calls", type=int, default=500,
                    help="calls in each run of a pair")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the backend's dist.all_reduce (sync and async) into "
                         "OUTDIR/profile.txt")
    a = ap.parse_args()
    if a.calls < 1 or a.rounds < 1 or a.pairs < 2 or a.pair_calls < 1 or a.bytes < 4 \
            or a.bytes % 4:
        sys.exit("--calls, --rounds and --pair-calls must be >= 1, --pairs >= 2 and --bytes a "
                 "positive multiple of 4")
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA device: pass --device cpu")

    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    ref = "nccl" if cuda else "gloo"
    dist.init_process_group(ref, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    fgroup = dist.new_group(backend="ferrocomm")
    store = dist.distributed_c10d._get_default_store()
    comm = ferrocomm.new_comm("ferrocomm" if cuda else "host", dev, "overhead", store=store,
                              rank=0, size=1)
    # Two more communicators, each used by one row only (sync calls of the direct API, so
    # neither ever queues on a work thread), one with its flight recorder on, one with it off
    # (the setting is read at creation): the recorder's host time per call is the difference
    # of the two rows, interleaved.
    saved = os.environ.get("FERROCOMM_FLIGHT_RECORDER")
    try:
        os.environ.pop("FERROCOMM_FLIGHT_RECORDER", None)
        comm_on = ferrocomm.new_comm("ferrocomm" if cuda else "host", dev, "overhead_on",
                                     store=store, rank=0, size=1)
        os.environ["FERROCOMM_FLIGHT_RECORDER"] = "0"
        comm_off = ferrocomm.new_comm("ferrocomm" if cuda else "host", dev, "overhead_off",
                                      store=store, rank=0, size=1)
        # The control: a second communicator with the recorder off, paired with the first
        # as the recorder's two are (what two communicators differ by when nothing does).
        comm_ctl = ferrocomm.new_comm("ferrocomm" if cuda else "host", dev, "overhead_ctl",
                                      store=store, rank=0, size=1)
    finally:
        if saved is None:
            os.environ.pop("FERROCOMM_FLIGHT_RECORDER", None)
        else:
            os.environ["FERROCOMM_FLIGHT_RECORDER"] = saved
    x = torch.ones(a.bytes // 4, dtype=torch.float32, device=dev)
    lp = {"low_precision": "e4m3"}

    def with_hints():
        with fct.hints(**lp):
            dist.all_reduce(x, group=fgroup)

    # The backend's own rows, which --profile lists.
    backend = [
        ("dist.all_reduce (\"ferrocomm\" backend)", lambda: dist.all_reduce(x, group=fgroup)),
        ("dist.all_reduce (\"ferrocomm\"), async_op=True",
         lambda: dist.all_reduce(x, group=fgroup, async_op=True)),
    ]
    rows = [
        ("bare kernel launch x.add_(0)", lambda: x.add_(0)),
        (f"dist.all_reduce ({ref} c10d)", lambda: dist.all_reduce(x)),
        (f"dist.all_reduce ({ref} c10d), async_op=True",
         lambda: dist.all_reduce(x, async_op=True)),
        ("comm.all_reduce (direct API)", lambda: comm.all_reduce(x)),
        ("comm.all_reduce, flight recorder on (2000 calls)", lambda: comm_on.all_reduce(x)),
        ("comm.all_reduce, flight recorder off", lambda: comm_off.all_reduce(x)),
        ("comm.all_reduce, async_op=True", lambda: comm.all_reduce(x, async_op=True)),
        ("comm.all_reduce, low-precision hint", lambda: comm.all_reduce(x, hints=lp)),
        *backend,
        ("dist.all_reduce (\"ferrocomm\"), hints()", with_hints),
    ]
    stats, seen = measure(rows, a.calls, a.rounds, cuda)
    results = [{"call": name, "host_us": round(med, 2), "min_us": round(lo, 2),
                "max_us": round(hi, 2)}
               for (name, _), (med, lo, hi) in zip(rows, stats)]
    # The recorder's cost, measured apart with finer pairing than the table's rows: many short
    # pairs of runs (--pair-calls calls with the recorder on, as many with it off, the order
    # alternating from pair to pair, so that a drift of the machine hits both alike), and the
    # median of the pairs' differences.
    # Each pair also times the control (a second communicator with the recorder off): its
    # difference from the first shows what two communicators differ by with nothing between
    # them. The three runs of a step take turns in every order.
    on_fn = next(fn for n, fn in rows if "flight recorder on" in n)
    off_fn = next(fn for n, fn in rows if "flight recorder off" in n)

    def ctl_fn():
        comm_ctl.all_reduce(x)

    orders = [(0, 1, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0), (1, 0, 2), (0, 2, 1)]
    diffs, ctl_diffs = [], []
    for k in range(a.pairs):
        t = [0.0, 0.0, 0.0]
        for i in orders[k % len(orders)]:
            t[i] = timed((on_fn, off_fn, ctl_fn)[i], a.pair_calls, cuda)
        diffs.append(t[0] - t[1])
        ctl_diffs.append(t[2] - t[1])

    def summary(d):
        q = statistics.quantiles(d, n=4)
        return {"us_per_call": round(statistics.median(d), 3),
                "min_us": round(min(d), 3), "max_us": round(max(d), 3),
                "q1_us": round(q[0], 3), "q3_us": round(q[2], 3),
                "pairs": a.pairs, "calls_per_run": a.pair_calls}

    recorder, control = summary(diffs), summary(ctl_diffs)
    bare = results[0]["host_us"]
    lines = [f"Host time per call, {a.bytes} B float32 on {dev}, world size 1: the median of "
             f"{a.rounds} rounds of {max(1, a.calls // a.rounds)} calls, rows interleaved "
             f"(ferrocomm {ferrocomm.__version__}, torch {torch.__version__})",
             "", "| call | host µs | x bare launch | rounds' range µs |", "|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['call']} | {r['host_us']:.1f} | {r['host_us'] / bare:.2f} | "
                     f"{r['min_us']:.1f}-{r['max_us']:.1f} |")
    lines += ["", f"flight recorder: {recorder['us_per_call']:+.3f} µs per call (on - off, the "
                  f"median of {a.pairs} pairs of {a.pair_calls}-call runs; quartiles "
                  f"{recorder['q1_us']:+.3f} to {recorder['q3_us']:+.3f}, range "
                  f"{recorder['min_us']:+.3f} to {recorder['max_us']:+.3f})",
              f"control: {control['us_per_call']:+.3f} µs per call (a second communicator "
              f"with the recorder off - the first, timed in the same steps, the first run "
              f"shared with the recorder's difference; quartiles "
              f"{control['q1_us']:+.3f} to {control['q3_us']:+.3f})"]
    table = "\n".join(lines)
    print(table)
    (out / "overhead.md").write_text(table + "\n")
    (out / "overhead.json").write_text(json.dumps(
        {"device": str(dev), "bytes": a.bytes, "calls": a.calls, "rounds": a.rounds,
         "rows": results, "flight_recorder": recorder, "control": control}, indent=2))
    if a.profile:
        s = io.StringIO()
        for name, fn in backend:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                fn()
            prof.disable()
            s.write(f"## {name}\n")
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        (out / "profile.txt").write_text(s.getvalue())
        print(f"profile: {out / 'profile.txt'}")
    if cuda:
        torch.cuda.synchronize()
    comm.finalize()
    comm_on.finalize()
    comm_off.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The local half of the fused all-reduce + residual add + RMSNorm on one GPU: ferrocomm's
``all_reduce_rmsnorm`` on a communicator of one rank (the residual add, the norm and the writes
every rank does) against ``torch.compile`` of the same three steps, and the one-launch kernels of
two ranks run on this GPU alone with their peer reads pointed at local memory; for one build of
ferrocomm, or for several side by side.

    python3 scripts/norm_bench.py OUTDIR [--quick | --rows 1,64,4096] [--hidden 4096,8192]
                                  [--dtype bfloat16] [--no-loopback]
    python3 scripts/norm_bench.py OUTDIR --variant A=BUILD_DIR/dist-A --variant B=BUILD_DIR/dist
                                  [--variant B16k=BUILD_DIR/dist@FERROCOMM_RMSNORM_WIDE_MAX_ROWS=16384]
    python3 scripts/norm_bench.py OUTDIR --profile [--rows 1 --hidden 4096] [--no-loopback]
                                  (a few eager calls of each kernel, for ncu)

Without ``--variant`` the ferrocomm that ``import ferrocomm`` finds is measured in this process.
Each ``--variant NAME=PATH[@VAR=VALUE,...]`` is a build of ferrocomm measured in a process of its
own: PATH is a wheel, or a directory holding one wheel (what scripts/gpu_prepare.sh leaves in
BUILD_DIR/dist, and with ``--variant NAME`` in BUILD_DIR/dist-NAME), installed offline into
OUTDIR/site-NAME, or a directory holding an installed ``ferrocomm`` package, put first on that
process's PYTHONPATH; the settings after ``@`` go into its environment (the same wheel may come
twice with other settings). Every shape is checked in every variant, then timed in rounds
(``--rounds``): each round times every variant in turn, the order rotated from round to round,
and torch.compile once (in the first variant's process), so that the builds are compared on the
same GPU in the same minutes. The variants' processes wait on a pipe while another one runs.

Every row is checked first (poisoned outputs, random inputs, against the float64 reference of
the three steps), then timed: a CUDA graph of 20 in-place calls (``x`` becomes ``y``, the
residual ``r``), captured once, replayed after a warm-up, CUDA events around each replay; the
median of all rounds' replays divided by 20. The compiled baseline is

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
import subprocess
import sys
import zlib
from pathlib import Path

CALLS = 20  # calls per graph
EPS = 1e-6
# Marks the lines of a variant's process that answer the driver (torch may print too).
REPLY = "@@norm_bench "
# Local traffic of the loopback kernels, in rows x hidden elements (see the module doc).
LOOP_UNITS = {"flat": 7.0, "tree": 7.5}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows_list(a):
    if a.rows:
        return [int(r) for r in a.rows.split(",")]
    if a.profile:
        return [1, 4096]
    if a.quick:
        return [1, 64, 512, 4096]
    return [1 << k for k in range(15)]  # 1 .. 16384


class Bench:
    """One build of ferrocomm on this process's GPU: its communicators, the compiled baseline,
    and the current shape's inputs and captured graphs."""

    def __init__(self, dtype, hiddens, max_rows, loopback, compiled):
        import torch
        import torch.distributed as dist

        import ferrocomm

        self.torch, self.dist, self.ferrocomm = torch, dist, ferrocomm
        if not torch.cuda.is_available():
            raise RuntimeError("norm_bench: no CUDA device")
        self.dev = torch.device("cuda", 0)
        torch.cuda.set_device(self.dev)
        self.dtype = getattr(torch, dtype)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
        store = dist.distributed_c10d._get_default_store()
        os.environ.pop("FERROCOMM_RMSNORM_LOOPBACK", None)
        self.comm = ferrocomm.new_comm("ferrocomm", self.dev, "norm_bench", store=store, rank=0,
                                       size=1)
        self.loop = None
        if loopback:
            # A staging that holds the largest two-shot call (x's rows and the published ones).
            os.environ["FERROCOMM_RMSNORM_LOOPBACK"] = "2"
            os.environ["FERROCOMM_CUDA_STAGING_BYTES"] = str(2 * max_rows * max(hiddens) * 4)
            self.loop = ferrocomm.new_comm("ferrocomm", self.dev, "norm_bench_loopback",
                                           store=store, rank=0, size=1)
            del os.environ["FERROCOMM_RMSNORM_LOOPBACK"]
            del os.environ["FERROCOMM_CUDA_STAGING_BYTES"]
        self.compiled = compiled
        self.steps = {}
        self.shape = None

    def info(self):
        return {"ferrocomm": self.ferrocomm.__version__, "torch": self.torch.__version__,
                "device": self.torch.cuda.get_device_name(self.dev),
                "module": os.path.dirname(self.ferrocomm.__file__)}

    def step(self, hidden):
        """torch.compile of the three steps, one compile per shape (static shapes, the
        compiler's best case): more than its default limit of recompiles."""
        torch = self.torch
        if hidden not in self.steps:
            torch._dynamo.config.recompile_limit = 1024
            torch._dynamo.config.accumulated_recompile_limit = 4096

            def step(x, residual, w):
                r = x + residual
                residual.copy_(r)
                x.copy_(torch.nn.functional.rms_norm(r.float(), (r.shape[-1],), w.float(),
                                                     EPS).to(x.dtype))

            self.steps[hidden] = torch.compile(step, dynamic=False, fullgraph=True)
        return self.steps[hidden]

    def set_shape(self, hidden, rows):
        """The inputs of a shape (the same in every variant: seeded by the shape), and the check
        of ferrocomm's call: the largest errors of y and of r."""
        torch = self.torch
        torch.manual_seed(zlib.crc32(f"{hidden}x{rows}".encode()))
        self.w = torch.rand(hidden, device=self.dev, dtype=self.dtype) + 0.5
        self.x = torch.randn(rows, hidden, device=self.dev, dtype=self.dtype)
        self.residual = torch.randn(rows, hidden, device=self.dev, dtype=self.dtype)
        self.shape = (hidden, rows)
        self.graphs = {}
        ey, er = self.check()
        return {"err_y": ey, "err_r": er}

    def reference(self):
        """The three steps in float64 of the rounded inputs: (r rounded to x's dtype, y)."""
        x, residual, w = self.x, self.residual, self.w
        r = (x.double() + residual.double()).to(x.dtype).double()
        inv = self.torch.rsqrt((r * r).mean(-1, keepdim=True) + EPS)
        return r, r * inv * w.double()

    def check(self):
        """ferrocomm's call against the float64 reference, outputs poisoned first; the largest
        error of y relative to the row's largest |y|, and of r."""
        torch = self.torch
        out = torch.full_like(self.x, float("nan"))
        rout = torch.full_like(self.x, float("nan"))
        self.comm.all_reduce_rmsnorm(self.x, self.residual, self.w, EPS, out=out,
                                     residual_out=rout)
        torch.cuda.synchronize()
        r_ref, y_ref = self.reference()
        if torch.isnan(out).any() or torch.isnan(rout).any():
            return float("inf"), float("inf")
        ey = ((out.double() - y_ref).abs().amax(-1) / y_ref.abs().amax(-1).clamp_min(1e-30)).max()
        er = ((rout.double() - r_ref).abs().amax(-1) / r_ref.abs().amax(-1).clamp_min(1e-30)).max()
        return float(ey), float(er)

    def calls(self, what):
        """A function issuing CALLS in-place calls of `what` on copies of the shape's inputs."""
        x, residual, w = self.x.clone(), self.residual.clone(), self.w
        if what == "ferrocomm":
            return lambda: [self.comm.all_reduce_rmsnorm(x, residual, w, EPS)
                            for _ in range(CALLS)]
        if what == "compiled":
            step = self.step(self.shape[0])
            return lambda: [step(x, residual, w) for _ in range(CALLS)]
        algo = what.removeprefix("loop_")
        return lambda: [self.loop.all_reduce_rmsnorm(x, residual, w, EPS, hints={"algo": algo})
                        for _ in range(CALLS)]

    def capture(self, fn):
        torch = self.torch
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
        return g

    def time(self, what, replays, warm=3):
        """µs per call of `what` in each of `replays` replays of its graph (captured at the
        first time of the shape), events around each replay."""
        torch = self.torch
        if what not in self.graphs:
            self.graphs[what] = self.capture(self.calls(what))
        g = self.graphs[what]
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
        return {"times": times}

    def profile(self, calls):
        """`calls` eager calls of every kernel of the shape (ncu skips and counts them)."""
        x, residual, w = self.x, self.residual, self.w
        for _ in range(calls):
            self.comm.all_reduce_rmsnorm(x.clone(), residual.clone(), w, EPS)
            if self.loop is not None:
                for algo in ("flat", "tree"):
                    self.loop.all_reduce_rmsnorm(x.clone(), residual.clone(), w, EPS,
                                                 hints={"algo": algo})
            if self.compiled:
                self.step(self.shape[0])(x.clone(), residual.clone(), w)
        self.torch.cuda.synchronize()
        return {}

    def close(self):
        self.comm.finalize()
        if self.loop is not None:
            self.loop.finalize()
        self.dist.destroy_process_group()


class Local:
    """The Bench of this process, called as a variant."""

    def __init__(self, name, init):
        self.name, self.settings = name, ""
        self.bench = Bench(**init)

    def ask(self, cmd, **kw):
        if cmd == "info":
            return self.bench.info()
        if cmd == "shape":
            return self.bench.set_shape(kw["hidden"], kw["rows"])
        if cmd == "time":
            return self.bench.time(kw["what"], kw["replays"])
        if cmd == "profile":
            return self.bench.profile(kw["calls"])
        raise ValueError(cmd)

    def close(self):
        self.bench.close()


def install(name, path, outdir):
    """The directory to put on PYTHONPATH for variant `name` of `path` (see the module doc)."""
    p = Path(path)
    if p.is_dir() and (p / "ferrocomm" / "__init__.py").exists():
        return p.resolve()
    wheels = [p] if p.is_file() else sorted(p.glob("ferrocomm-*.whl"))
    if len(wheels) != 1 or wheels[0].suffix != ".whl":
        sys.exit(f"norm_bench: variant {name}: {path} is not a wheel, a directory of one wheel, "
                 f"or a directory holding an installed ferrocomm (found {len(wheels)} wheels)")
    site = (outdir / f"site-{name}").resolve()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--upgrade", "--target", str(site), str(wheels[0])], check=True)
    return site


class Remote:
    """A variant's process: this script with --worker, asked one JSON line at a time."""

    def __init__(self, name, site, settings, init):
        self.name, self.settings = name, settings
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH")] if p])
        for kv in filter(None, settings.split(",")):
            k, eq, v = kv.partition("=")
            if not eq or not k:
                sys.exit(f"norm_bench: variant {name}: setting {kv!r} is not VAR=VALUE")
            env[k] = v
        # The process's stdout carries its answers; what else it prints goes to our stderr.
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, bufsize=1)
        self.ask("init", **init)

    def ask(self, cmd, **kw):
        self.p.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.p.stdin.flush()
        for line in self.p.stdout:
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY):])
                if "error" in reply:
                    sys.exit(f"norm_bench: variant {self.name}: {reply['error']}")
                return reply
            sys.stderr.write(f"[{self.name}] {line}")
        sys.exit(f"norm_bench: variant {self.name}: its process ended (exit {self.p.wait()})")

    def close(self):
        self.ask("quit")
        self.p.wait()


def worker():
    """The variant side of Remote: commands on stdin, answers on stdout after REPLY."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to the driver's stderr
    bench = None
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        try:
            if cmd == "init":
                bench = Local("worker", msg)
                reply = {}
            elif cmd == "quit":
                bench.close()
                reply = {}
            else:
                reply = bench.ask(cmd, **msg)
        except Exception as e:  # reported to the driver, which stops
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(REPLY + json.dumps(reply) + "\n")
        out.flush()
        if cmd == "quit":
            return


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--quick", action="store_true", help="four row counts instead of 15")
    ap.add_argument("--rows", help="row counts, comma-separated (instead of the default 15)")
    ap.add_argument("--hidden", default="4096,8192")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--replays", type=int, default=50, help="replays of a graph per round")
    ap.add_argument("--rounds", type=int, help="rounds of timing (default 1, 2 with variants)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH[@VAR=VALUE,...]",
                    help="a build of ferrocomm to measure in a process of its own (repeatable)")
    ap.add_argument("--profile", action="store_true",
                    help="only a few eager calls of each kernel (to run under ncu)")
    ap.add_argument("--profile-calls", type=int, default=3)
    ap.add_argument("--no-loopback", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker()
    if a.outdir is None:
        ap.error("OUTDIR is required")
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    hiddens = [int(h) for h in a.hidden.split(",")]
    rows_all = rows_list(a)
    rounds = a.rounds or (2 if a.variant else 1)
    init = {"dtype": a.dtype, "hiddens": hiddens, "max_rows": max(rows_all),
            "loopback": not a.no_loopback}
    variants = []
    if not a.variant:
        variants.append(Local("ferrocomm", dict(init, compiled=True)))
    for k, spec in enumerate(a.variant):
        name, eq, rest = spec.partition("=")
        path, _, settings = rest.partition("@")
        if not eq or not name or not path or not all(c.isalnum() or c in "._-" for c in name):
            ap.error(f"--variant {spec!r}: expected NAME=PATH[@VAR=VALUE,...], NAME of letters, "
                     "digits, '.', '_' and '-'")
        if name in [v.name for v in variants]:
            ap.error(f"--variant {name} given twice")
        variants.append(Remote(name, install(name, path, out), settings,
                               dict(init, compiled=k == 0)))
    infos = {v.name: dict(v.ask("info"), settings=v.settings) for v in variants}
    for name, i in infos.items():
        print(f"{name}: ferrocomm {i['ferrocomm']} from {i['module']}"
              f"{' with ' + i['settings'] if i['settings'] else ''}", flush=True)
    esize = {"bfloat16": 2, "float16": 2, "float32": 4}[a.dtype]
    names = [v.name for v in variants]
    whats = ["ferrocomm"] + ([] if a.no_loopback else ["loop_flat", "loop_tree"])
    results = []
    for hidden in hiddens:
        for rows in rows_all:
            row = {"hidden": hidden, "rows": rows, "dtype": a.dtype, "variants": {}}
            for v in variants:
                row["variants"][v.name] = dict(v.ask("shape", hidden=hidden, rows=rows),
                                               times={w: [] for w in whats}, rounds={})
            if a.profile:
                for v in variants:
                    v.ask("profile", calls=a.profile_calls)
                continue
            compiled = []
            for rnd in range(rounds):
                order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                for v in order:
                    for w in whats:
                        t = v.ask("time", what=w, replays=a.replays)["times"]
                        r = row["variants"][v.name]
                        r["times"][w] += t
                        r["rounds"].setdefault(w, []).append(median(t))
                compiled += variants[0].ask("time", what="compiled", replays=a.replays)["times"]
            row["compiled_us"] = median(compiled)
            row["compiled_tbs"] = 4 * rows * hidden * esize / row["compiled_us"] / 1e6
            for name in names:
                r = row["variants"][name]
                r["us"] = median(r["times"]["ferrocomm"])
                r["tbs"] = 4 * rows * hidden * esize / r["us"] / 1e6
                for algo, units in LOOP_UNITS.items():
                    if f"loop_{algo}" in whats:
                        r[f"loop_{algo}_us"] = median(r["times"][f"loop_{algo}"])
                        r[f"loop_{algo}_tbs"] = (units * rows * hidden * esize
                                                 / r[f"loop_{algo}_us"] / 1e6)
                del r["times"]
            results.append(row)
            print(f"{hidden} x {rows}: compiled {row['compiled_us']:.2f} µs; " + "; ".join(
                f"{n} {row['variants'][n]['us']:.2f} µs "
                f"({row['variants'][n]['us'] / row['compiled_us']:.2f}x, "
                f"err y {row['variants'][n]['err_y']:.1e})" for n in names), flush=True)
    if a.profile:
        print("profile calls issued")
    else:
        report(a, out, names, infos, rounds, results, hiddens, whats)
    for v in variants:
        v.close()


def report(a, out, names, infos, rounds, results, hiddens, whats):
    """norm_bench.md, norm_bench.json and norm_bench.png."""
    first = infos[names[0]]
    device = first["device"]
    builds = "; ".join(f"{n}: ferrocomm {i['ferrocomm']}"
                       f"{' with ' + i['settings'] if i['settings'] else ''}"
                       for n, i in infos.items())
    lines = [f"all_reduce_rmsnorm's local half, {a.dtype}, world size 1, {device}: µs per call in "
             f"a CUDA graph of {CALLS} calls (median of {rounds} x {a.replays} replays); "
             f"effective TB/s over 4 x rows x hidden elements ({builds}; torch {first['torch']})",
             ""]
    head = "| hidden x rows | torch.compile µs |"
    rule = "|---|---:|"
    for n in names:
        head += f" {n} µs | {n} / compiled | {n} TB/s |"
        rule += "---:|---:|---:|"
    for n in names[1:]:
        head += f" {n} / {names[0]} |"
        rule += "---:|"
    head += " max err y | max err r |"
    rule += "---:|---:|"
    lines += [head, rule]
    for r in results:
        v = r["variants"]
        cells = [f"{r['hidden']} x {r['rows']}", f"{r['compiled_us']:.2f}"]
        for n in names:
            cells += [f"{v[n]['us']:.2f}", f"{v[n]['us'] / r['compiled_us']:.2f}",
                      f"{v[n]['tbs']:.2f}"]
        cells += [f"{v[n]['us'] / v[names[0]]['us']:.2f}" for n in names[1:]]
        cells += [f"{max(v[n]['err_y'] for n in names):.1e}",
                  f"{max(v[n]['err_r'] for n in names):.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    if "loop_flat" in whats:
        lines += ["", "Two-rank one-launch kernels on this GPU alone (FERROCOMM_RMSNORM_LOOPBACK=2: "
                  "the peer's staging is local memory, no barrier): µs per call and local "
                  "traffic in TB/s (one-shot 7, two-shot 7.5 x rows x hidden elements), against "
                  "the same build's world-1 TB/s", ""]
        head = "| hidden x rows |"
        rule = "|---|"
        for n in names:
            head += (f" {n} one-shot µs | {n} one-shot TB/s | {n} two-shot µs | "
                     f"{n} two-shot TB/s | {n} one-shot / world 1 | {n} two-shot / world 1 |")
            rule += "---:|---:|---:|---:|---:|---:|"
        lines += [head, rule]
        for r in results:
            cells = [f"{r['hidden']} x {r['rows']}"]
            for n in names:
                v = r["variants"][n]
                cells += [f"{v['loop_flat_us']:.2f}", f"{v['loop_flat_tbs']:.2f}",
                          f"{v['loop_tree_us']:.2f}", f"{v['loop_tree_tbs']:.2f}",
                          f"{v['loop_flat_tbs'] / v['tbs']:.2f}",
                          f"{v['loop_tree_tbs'] / v['tbs']:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    (out / "norm_bench.md").write_text(table + "\n")
    (out / "norm_bench.json").write_text(json.dumps({"device": device, "calls": CALLS,
                                                     "replays": a.replays, "rounds": rounds,
                                                     "builds": infos, "rows": results},
                                                    indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, axes = plt.subplots(1, len(hiddens), figsize=(6 * len(hiddens), 4.5), squeeze=False)
    for ax, hidden in zip(axes[0], hiddens):
        rs = [r for r in results if r["hidden"] == hidden]
        xs = [r["rows"] for r in rs]
        ax.plot(xs, [r["compiled_us"] for r in rs], "s--", label="torch.compile")
        for n in names:
            label = "ferrocomm (world 1)" if len(names) == 1 else f"{n} (world 1)"
            ax.plot(xs, [r["variants"][n]["us"] for r in rs], "o-", label=label)
            if "loop_flat" in whats:
                ax.plot(xs, [r["variants"][n]["loop_flat_us"] for r in rs], "^:",
                        label=f"{n}: 2-rank one-shot, loopback")
                ax.plot(xs, [r["variants"][n]["loop_tree_us"] for r in rs], "v:",
                        label=f"{n}: 2-rank two-shot, loopback")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("rows")
        ax.set_ylabel("µs per call")
        ax.set_title(f"hidden {hidden}, {a.dtype}, {device}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "norm_bench.png", dpi=110)


if __name__ == "__main__":
    main()

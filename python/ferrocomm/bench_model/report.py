"""The run folder: result.json (command, machine, results), a PNG, and the terminal tables."""

import datetime
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import torch


def machine(device, world):
    import ferrocomm

    info = {"host": socket.gethostname(), "platform": platform.platform(),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "ferrocomm": ferrocomm.__version__, "revision": _revision(),
            "world_size": world, "device": str(device),
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith(("FERROCOMM_", "NCCL_"))}}
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpus_visible"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
    else:
        info["cpus"] = os.cpu_count()
    return info


def default_out():
    """bench/results/YYYY-MM-DD-<host>-model-HHMMSS (UTC), as bench/results/README.md names runs."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return Path("bench/results") / (f"{now:%Y-%m-%d}-{socket.gethostname()}-model-"
                                    f"{now:%H%M%S}")


def _revision():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write(out, doc):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    m = doc.get("machine", {})
    lines = [" ".join(["python", *doc["command"][1:]]),
             *(f"{k}: {m[k]}" for k in ("host", "gpu", "cuda", "torch", "ferrocomm", "revision",
                                         "world_size", "device") if m.get(k) is not None),
             *(f"{k}={v}" for k, v in m.get("env", {}).items()), "", tables(doc)]
    (out / "command.txt").write_text("\n".join(lines) + "\n")
    plot(out, doc)
    return out


def table(rows, cols):
    """A plain text table of dict rows; `cols` is [(header, key, format)]."""
    cells = [[h for h, _, _ in cols]]
    for r in rows:
        cells.append([("" if r.get(k) is None else f.format(r[k])) for _, k, f in cols])
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def tables(doc):
    out = []
    t = doc.get("timing")
    if t:
        if t["decode"]:
            out.append("decode (time per output token, median; comm = share of the step "
                       "spent communicating)\n" + table(t["decode"], [
                           ("path", "path", "{}"), ("batch", "batch", "{}"),
                           ("context", "context", "{}"), ("graph", "graph", "{}"),
                           ("TPOT ms", "tpot_ms", "{:.3f}"), ("comm", "comm_share", "{:.1%}")]))
        if t["prefill"]:
            out.append("prefill (time to first token, median)\n" + table(t["prefill"], [
                ("path", "path", "{}"), ("prompt", "prompt", "{}"),
                ("TTFT ms", "ttft_ms", "{:.2f}"), ("comm", "comm_share", "{:.1%}")]))
    c = doc.get("check")
    if c:
        out.append(f"tensor-parallel vs unsharded ({'passed' if c['passed'] else 'FAILED'})\n"
                   + table(c["rows"], [("path", "path", "{}"),
                                       ("max abs diff", "max_abs_diff", "{:.3e}"),
                                       ("tolerance", "tolerance", "{:.1e}"),
                                       ("greedy agree", "top1_agreement", "{:.4f}"),
                                       ("verdict", "verdict", "{}")]))
    f = doc.get("fidelity")
    if f:
        if f.get("paths"):
            out.append(f"logits, random weights ({f['paths']['model']['name']}), "
                       "teacher-forced decode\n" + table(f["paths"]["rows"], [
                           ("path", "path", "{}"), ("format", "format", "{}"),
                           ("against", "against", "{}"),
                           ("max abs diff", "max_abs_diff", "{:.3e}"),
                           ("top-1 agree", "top1_agreement", "{:.4f}"),
                           ("KL mean", "kl_mean", "{:.2e}")]))
        p = f.get("perplexity")
        if p:
            out.append(f"perplexity on held-out text ({f['lm']['name']}, {p['tokens']} tokens)\n"
                       + table(p["rows"], [("path", "path", "{}"), ("format", "format", "{}"),
                                           ("all-reduce", "algo", "{}"),
                                           ("perplexity", "perplexity", "{:.4f}"),
                                           ("delta", "ppl_delta_pct", "{:+.3f}%"),
                                           ("KL mean", "kl_mean", "{:.2e}"),
                                           ("top-1 agree", "top1_agreement", "{:.4f}")]))
    return "\n\n".join(out)


def plot(out, doc):
    """result.png: TPOT per path and batch, TTFT per prompt length, perplexity per format."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)", file=sys.stderr)
        return
    panels = []
    t = doc.get("timing") or {}
    if t.get("decode"):
        panels.append(("decode: time per output token (ms)", "batch", "tpot_ms", t["decode"]))
    if t.get("prefill"):
        panels.append(("prefill: time to first token (ms)", "prompt", "ttft_ms", t["prefill"]))
    p = (doc.get("fidelity") or {}).get("perplexity")
    if not panels and not p:
        return
    n = len(panels) + (1 if p else 0)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.5), squeeze=False)
    for ax, (title, xkey, ykey, rows) in zip(axes[0], panels):
        paths = list(dict.fromkeys(r["path"] for r in rows))
        xs = sorted({r[xkey] for r in rows})
        w = 0.8 / len(paths)
        for i, path in enumerate(paths):
            vals = {r[xkey]: r[ykey] for r in rows if r["path"] == path}
            ax.bar([j + i * w for j in range(len(xs))], [vals.get(x, 0) for x in xs], w,
                   label=path)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(xs))], [str(x) for x in xs])
        ax.set_xlabel(xkey)
        ax.set_title(title)
        ax.legend(fontsize=8)
    if p:
        ax = axes[0][-1]
        labels = [f"{r['path'].replace('ferrocomm', 'fc')}\n{r['format']} {r['algo'].split()[0]}"
                  for r in p["rows"]]
        ax.bar(range(len(labels)), [r["ppl_delta_pct"] for r in p["rows"]])
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=60)
        ax.set_ylabel("perplexity change vs full precision one-shot (%)")
        ax.set_title(f"perplexity on held-out text (full: {p['rows'][0]['perplexity']:.3f})")
    fig.suptitle(" ".join(["python", *doc["command"][1:]])[:160], fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "result.png", dpi=110)
    plt.close(fig)

"""Loopback times of every variant in a norm_bench.json: python3 plot.py [FOLDER] -> FOLDER/plot.png."""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

folder = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
d = json.loads((folder / "norm_bench.json").read_text())
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
for ax, key, title in zip(axes, ("loop_flat_us", "loop_tree_us"), ("one-shot", "two-shot")):
    for hidden in sorted({r["hidden"] for r in d["rows"]}):
        rows = [r for r in d["rows"] if r["hidden"] == hidden]
        for name in rows[0]["variants"]:
            xs = [r["rows"] for r in rows]
            ys = [r["variants"][name][key] for r in rows]
            ax.plot(xs, ys, marker="o", label=f"{name}, hidden {hidden}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rows")
    ax.set_ylabel("µs per call (CUDA graph)")
    ax.set_title(f"{title}, loopback 2 ranks, {d['device']}")
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(folder / "plot.png", dpi=110)

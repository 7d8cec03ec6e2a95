"""The recorder_cost.png of this folder, from its overhead-*.json (see command.txt)."""
import json, sys
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = Path(sys.argv[1])
fig, ax = plt.subplots(figsize=(7, 4))
for k, (name, color) in enumerate([("before", "tab:red"), ("after", "tab:blue")]):
    for key, marker, lab in [("flight_recorder", "o", "recorder"), ("control", "x", "control")]:
        xs, ys, lo, hi = [], [], [], []
        for i in (1, 2, 3):
            r = json.loads((d / f"overhead-{name}-{i}.json").read_text())[key]
            xs.append(2 * i - 1 + k * 0.3); ys.append(r["us_per_call"])
            lo.append(r["us_per_call"] - r["q1_us"]); hi.append(r["q3_us"] - r["us_per_call"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=marker, color=color, capsize=3,
                    alpha=1.0 if key == "flight_recorder" else 0.5, label=f"{lab}, {name}")
ax.axhline(0.3, color="gray", ls="--", lw=1, label="0.3 µs")
ax.axhline(0, color="black", lw=0.5)
ax.set_xticks([1.15, 3.15, 5.15], ["pair 1", "pair 2", "pair 3"])
ax.set_ylabel("host µs per call (median, quartiles)")
ax.set_title("Flight recorder's host cost per call, one H200 (on - off; control: off - off)")
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
fig.savefig(d / "recorder_cost.png", dpi=120)

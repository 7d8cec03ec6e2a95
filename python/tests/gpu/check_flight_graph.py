"""GPU check of the flight recorder under CUDA graphs: a call captured into a graph is recorded
once, at capture (state ``captured``), its replays add no entry, and the dumps taken after the
replays are read by both analyzers without a hang or a mismatch reported.

    ferrocomm launch -n 2 -- python3 python/tests/gpu/check_flight_graph.py OUT_DIR [--share-gpus]

(torchrun works too; ``--share-gpus`` as in check_dynamic.py: every rank on GPU ``LOCAL_RANK
mod count``, NCCL not loaded.) Every rank makes call #1 eagerly, #2 on a side stream and #3 in
the capture (``shared_check.captured``), replays the graph with fresh inputs (each replay's sum
is kept on the device and checked at the end), makes call #4 eagerly, and dumps its recorder
to OUT_DIR/trace: call #1 ``completed`` (call #4 began after it on its stream), #2 and #4
``began`` (their kernels' marks: each is the latest call of its stream, so nothing shows its
end), the captured one ``captured``. Rank 0 then runs ``ferrocomm trace`` (the native analysis) and torch's
``fr_trace`` on the two dumps and prints both reports. Prints a summary; exits 1 on any failure.
"""

import os
import pickle
import subprocess
import sys

import torch

import ferrocomm
from ferrocomm import _native
from shared_check import DEV, RANK, WORLD, captured, finish, record

REPLAYS = 200
COUNT = 4096


def main():
    dirs = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(dirs) != 1:
        sys.exit("usage: check_flight_graph.py OUT_DIR [--share-gpus]")
    trace = os.path.join(os.path.abspath(dirs[0]), "trace")
    os.makedirs(trace, mode=0o700, exist_ok=True)
    torch.cuda.set_device(DEV)
    comm = ferrocomm.new_comm("ferrocomm", DEV, "check-flight-graph")
    x = torch.empty(COUNT, device=DEV)

    def total(k):
        """The sum over ranks of rank r's value k + r + 1."""
        return float(sum(k + r + 1 for r in range(WORLD)))

    # Call #1, eager.
    x.fill_(1 + RANK)
    comm.all_reduce(x)
    record("eager all_reduce", bool((x == total(0)).all()), f"{x[0].item()}")
    # Calls #2 (the warm-up on a side stream) and #3 (the capture).
    graph = captured(lambda: comm.all_reduce(x))
    sums = torch.empty(REPLAYS, device=DEV)
    for k in range(REPLAYS):
        x.fill_(k + 1 + RANK)
        graph.replay()
        sums[k] = x[COUNT - 1]
    want = torch.tensor([total(k) for k in range(REPLAYS)], device=DEV)
    bad = (sums != want).nonzero().flatten().tolist()
    record(f"{REPLAYS} replays", not bad, f"replays {bad[:5]} wrong")
    # Call #4, eager, after the replays.
    x.fill_(1 + RANK)
    comm.all_reduce(x)
    record("eager all_reduce after the replays", bool((x == total(0)).all()), f"{x[0].item()}")
    torch.cuda.synchronize(DEV)

    path = comm.dump_flight_recorder(os.path.join(trace, f"ferrocomm_trace_rank_{RANK}"))
    with open(path, "rb") as f:
        d = pickle.load(f)
    uid = next(u for u, g in d["pg_config"].items()
               if g.get("ferrocomm_name") == "check-flight-graph")
    mine = [e for e in d["entries"] if e["process_group"][0] == uid]
    seqs = [e["collective_seq_id"] for e in mine]
    states = [e["ferrocomm_state"] for e in mine]
    print(f"[rank {RANK}] recorded calls {seqs}, states {states}", flush=True)
    record("one entry per call, none per replay", seqs == [1, 2, 3, 4], f"{seqs}")
    # Every eager call's kernel marked its start; #1 has #4 after it on its stream.
    record("the captured call is recorded as captured, the eager ones from their marks",
           states == ["completed", "began", "captured", "began"], f"{states}")
    record("torch's state of the captured call", mine[2]["state"] == "scheduled"
           if len(mine) == 4 else False, f"{[e['state'] for e in mine]}")
    # Both dumps written before rank 0 reads them.
    comm.barrier()
    if RANK == 0:
        report = _native.analyze_traces(trace)
        print(f"ferrocomm trace {trace}:\n{report}", flush=True)
        record("ferrocomm trace: no divergence, nothing taken for a hang",
               "no divergence: every rank made calls #1 to #4" in report
               and "did not finish" not in report, report)
        fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                             trace], capture_output=True, text=True, timeout=120)
        text = fr.stdout + fr.stderr
        print(f"fr_trace {trace} (exit {fr.returncode}):\n{text}", flush=True)
        record("fr_trace: no mismatch", fr.returncode == 0 and "MISMATCH" not in text
               and "Culprit" not in text, text[-2000:])
    finish(comm)


if __name__ == "__main__":
    main()

"""When something goes wrong (docs/reliability.md), on the host backend with real processes:
a rank killed mid-call, the dumps torch's flight-recorder analyzer reads, the dump on SIGUSR1,
hooks, checked calls, torch.distributed's store reused by new_comm and the error when the
store's port is taken."""

import os
import pickle
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import HERE, rank_env, run_ranks, start_ranks

import ferrocomm
from ferrocomm import _native


def start(world, scenario, env):
    return start_ranks(world, "reliability_ranks.py", scenario, env, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def line_with(proc, tag, deadline, seen):
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if tag in line:
            return line[line.index(tag) + len(tag):].strip()
    pytest.fail(f"no {tag!r} line:\n{''.join(seen)}")


def test_a_rank_killed_mid_call_is_named_within_a_second_and_the_dumps_are_read(tmp_path):
    trace = tmp_path / "trace"
    procs = start(3, "kill", {"FERROCOMM_TRACE_DIR": str(trace)})
    deadline = time.monotonic() + 120
    seen = [[], [], []]
    try:
        line_with(procs[1], "PARKED", deadline, seen[1])
        for r in (0, 2):
            line_with(procs[r], "CALLING", deadline, seen[r])
        procs[1].kill()
        killed = time.monotonic()
        for r in (0, 2):
            failed = line_with(procs[r], "FAILED", deadline, seen[r])
            took = float(failed.split()[0]) - killed
            assert took < 1.0, f"rank {r}: SIGKILL to error took {took:.3f} s: {failed}"
            later = line_with(procs[r], "LATER", deadline, seen[r])
            assert "rank 1" in later, later
            line_with(procs[r], "DONE", deadline, seen[r])
        for r in (0, 2):
            procs[r].stdout.read()
            procs[r].wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert [procs[0].returncode, procs[2].returncode] == [0, 0]
    dumps = sorted(os.listdir(trace))
    assert dumps == ["ferrocomm_trace_rank_0", "ferrocomm_trace_rank_2"], dumps
    # torch's analyzer reads them (rank 1 left none: it died), naming the rank it lacks.
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                         str(trace), "--allow-incomplete-ranks"], capture_output=True,
                        text=True, timeout=300)
    assert fr.returncode == 0, fr.stdout + fr.stderr
    assert "missed FR dumps from ranks ({1})" in fr.stderr, fr.stderr
    # And so does ferrocomm's (`ferrocomm trace DIR`).
    report = _native.analyze_traces(str(trace))
    assert "no dump from rank 1" in report and "rank 1 is missing from call #2" in report, report


def test_a_rank_that_makes_another_call_is_named_by_both_analyzers(tmp_path):
    trace = tmp_path / "trace"
    outs = run_ranks(3, "skip", env={"FERROCOMM_TRACE_DIR": str(trace)},
                     script="reliability_ranks.py")
    assert all("skip ok" in o for o in outs), outs
    assert sorted(os.listdir(trace)) == [f"ferrocomm_trace_rank_{r}" for r in range(3)]
    report = _native.analyze_traces(str(trace))
    assert "first divergence at call #2" in report, report
    assert "rank 1 made a different call" in report, report
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                         str(trace)], capture_output=True, text=True, timeout=300)
    assert fr.returncode == 0, fr.stdout + fr.stderr
    assert "COLLECTIVE_TYPE_MISMATCH" in fr.stderr and "Culprit rank 1" in fr.stderr, fr.stderr


def test_hooks_see_every_call_in_order_with_its_arguments():
    outs = run_ranks(2, "hooks", script="reliability_ranks.py")
    assert all("hooks ok" in o for o in outs), outs


def test_checked_calls_raise_at_the_call_that_differs_on_every_rank():
    outs = run_ranks(3, "check_calls", env={"FERROCOMM_CHECK_CALLS": "1"},
                     script="reliability_ranks.py")
    assert all("check_calls ok" in o for o in outs), outs


def test_a_call_one_rank_refuses_fails_at_once_on_every_rank():
    outs = run_ranks(3, "refuse", script="reliability_ranks.py")
    assert all("refuse ok" in o for o in outs), outs


def test_new_comm_after_init_process_group_started_by_hand_uses_torchs_store():
    outs = run_ranks(2, "torch_store", script="reliability_ranks.py")
    assert all("torch_store ok" in o for o in outs), outs


def test_sigusr1_dumps_the_flight_recorder_of_the_signalled_rank(tmp_path):
    trace = tmp_path / "trace"
    procs = start(2, "sigusr1", {"FERROCOMM_TRACE_DIR": str(trace),
                                 "FERROCOMM_TRACE_ON_SIGUSR1": "1"})
    deadline = time.monotonic() + 120
    seen = [[], []]
    try:
        pids = [int(line_with(p, "READY", deadline, s)) for p, s in zip(procs, seen)]
        os.kill(pids[1], signal.SIGUSR1)
        dump = trace / "ferrocomm_trace_rank_1"
        # The dump is written by the rank's signal thread: waited for, with a deadline.
        while not dump.exists():
            assert time.monotonic() < deadline, "no dump after SIGUSR1"
            assert procs[1].poll() is None, f"SIGUSR1 ended rank 1 ({procs[1].returncode})"
            time.sleep(0.02)
        with open(dump, "rb") as f:
            d = pickle.load(f)
        assert d["ferrocomm"]["reason"] == "SIGUSR1", d["ferrocomm"]
        calls = [(e["ferrocomm_call"], e["ferrocomm_state"]) for e in d["entries"]]
        assert calls == [("all_reduce(count=64, dtype=float, op=sum)", "completed")], calls
        # Only the signalled rank dumped.
        assert sorted(os.listdir(trace)) == ["ferrocomm_trace_rank_1"], os.listdir(trace)
        for p, s in zip(procs, seen):
            p.stdin.write("\n")
            p.stdin.flush()
            line_with(p, "sigusr1 ok", deadline, s)
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0]


def test_a_taken_store_port_is_named_with_the_variable_to_set():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        e = rank_env(0, 2, port)
        for k in ("FERROCOMM_STORE_PORT", "FERROCOMM_STORE_ADDR", "FERROCOMM_STORE_EXTERNAL",
                  "TORCHELASTIC_RUN_ID"):
            e.pop(k, None)
        out = subprocess.run([sys.executable, str(HERE / "reliability_ranks.py"), "port_taken"],
                             env=e, cwd=str(HERE), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "port_taken ok" in out.stdout, out.stdout + out.stderr


def test_flight_recorder_hook_and_on_demand_dump(tmp_path):
    store = _FileStoreless()
    comm = ferrocomm.new_comm("host", "cpu", "fr_hook", rank=0, size=1, store=store)
    import numpy as np
    x = np.ones(4, dtype=np.float32)
    comm.all_reduce(x)
    fr = ferrocomm.hooks.FlightRecorderHook(max_entries=16)
    fr.register_with_comm(comm)
    assert fr.is_enabled() and fr.size() == 0
    comm.all_reduce(x)
    comm.barrier()
    import json
    d = json.loads(fr.dump_json())
    assert [e["profiling_name"] for e in d["entries"]] == ["nccl:all_reduce",
                                                          "nccl:all_reduce_barrier"]
    assert fr.size() == 2
    fr.reset()
    assert fr.size() == 0
    path = comm.dump_flight_recorder(tmp_path / "dump_rank_0")
    import pickle
    with open(path, "rb") as f:
        dump = pickle.load(f)
    assert len(dump["entries"]) == 3 and dump["version"] == "2.10"
    comm.finalize()


class _FileStoreless:
    """A store for one rank in this process (every key set is there at once)."""

    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v

    def get(self, k):
        return self.d[k]

    def wait(self, keys, timeout=None):
        missing = [k for k in keys if k not in self.d]
        if missing:
            raise TimeoutError(f"timed out waiting for {missing}")

    def check(self, keys):
        return all(k in self.d for k in keys)

    def add(self, k, n):
        self.d[k] = str(int(self.d.get(k, b"0")) + n).encode()
        return int(self.d[k])

    def delete_key(self, k):
        return self.d.pop(k, None) is not None

"""Helpers for the multi-process tests: a rank launcher and a file-backed Python store."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from filestore import FileStore  # noqa: F401 (re-exported for tests)

import pytest

HERE = Path(__file__).resolve().parent

# The GPU check runs under torchrun on a GPU machine, never under pytest.
collect_ignore = ["gpu"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, world, port, env=None):
    """This process's environment for rank `rank` of `world` meeting at `port` on this host,
    with this folder on PYTHONPATH, then `env`."""
    e = dict(os.environ)
    e.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
             LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
             PYTHONPATH=str(HERE) + os.pathsep + e.get("PYTHONPATH", ""))
    e.update(env or {})
    return e


def start_ranks(world, script, scenario, env=None, **popen):
    """Starts `python <script> scenario` as `world` processes of one job (the rank variables,
    a free port on this host, this folder on PYTHONPATH, then `env`); `popen` goes to Popen."""
    port = free_port()
    return [subprocess.Popen([sys.executable, str(HERE / script), scenario],
                             env=rank_env(r, world, port, env), cwd=str(HERE), text=True,
                             **popen)
            for r in range(world)]


def run_ranks(world, scenario, env=None, timeout=300, expect_ok=True, script="ranks.py"):
    """Runs `python <script> scenario` as `world` processes; returns their outputs.

    `timeout` is a deadline that only a hang reaches: two cores kept busy by other work make a
    run take several times as long as on an idle machine (a torch import alone can take half a
    minute), so it is generous; no test bounds its running time by it."""
    procs = start_ranks(world, script, scenario, env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    outs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out = p.communicate()[0]
            outs.append(out)
            pytest.fail(f"{scenario} on {world} ranks did not finish in {timeout}s:\n"
                        + "\n".join(outs))
        outs.append(out)
    codes = [p.returncode for p in procs]
    if expect_ok and any(codes):
        report = "\n".join(f"--- rank {r} (exit {c}) ---\n{o}"
                           for r, (c, o) in enumerate(zip(codes, outs)))
        pytest.fail(f"{scenario} on {world} ranks failed:\n{report}")
    return outs

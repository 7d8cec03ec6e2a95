"""The Python API on the host backend with real processes (2 and 4 ranks)."""

import json
import os
import selectors
import signal
import subprocess
import sys

import pytest

from conftest import HERE, free_port, run_ranks


@pytest.mark.parametrize("world", [2, 4])
def test_every_method_dtype_and_op(world):
    outs = run_ranks(world, "collectives", timeout=600)
    assert all("collectives ok" in o for o in outs)


@pytest.mark.parametrize("world", [2, 4])
def test_async_work(world):
    run_ranks(world, "async")


def test_argument_errors():
    run_ranks(2, "errors")


@pytest.mark.parametrize("world", [2, 4])
def test_narrow_types(world):
    """bool, int16 and uint16: movement bit for bit, bool reductions, refusals."""
    run_ranks(world, "narrow")


@pytest.mark.parametrize("world", [2, 4])
def test_low_precision_hints(world):
    """E4M3 through hints: bounded error, rank-identical sums, the all-to-all's own part exact."""
    run_ranks(world, "low_precision")


def test_hostile_values():
    run_ranks(3, "hostile")


def test_a_rank_with_another_store_secret_is_refused():
    """Rank 1 holds another FERROCOMM_STORE_SECRET than rank 0, whose store it reaches: it is
    refused at once, naming the secret; rank 0 times out (3 s) waiting for it.

    Rank 1 starts first and says when it is about to connect (it then retries until rank 0's
    server is up, for up to 60 s): it reaches the server within rank 0's 3 s however slowly
    the processes start."""
    port = free_port()
    code = ("import sys, ferrocomm\n"
            "timeout = int(sys.argv[1])\n"
            "print('CONNECTING', flush=True)\n"
            "try:\n"
            "    ferrocomm.new_comm('host', 'cpu', 'secret', timeout=timeout)\n"
            "    print('JOINED')\n"
            "except ferrocomm.FerrocommError as e:\n"
            "    print('REFUSED', type(e).__name__, e)\n")

    def start(rank, secret, timeout):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   FERROCOMM_STORE_SECRET=secret)
        return subprocess.Popen([sys.executable, "-c", code, str(timeout)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    r1 = start(1, "a stranger's guess 0123456789", 60)
    with selectors.DefaultSelector() as sel:
        sel.register(r1.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=300):
            r1.kill()
            pytest.fail("rank 1 did not start within 300 s: " + r1.communicate()[0])
    first = r1.stdout.readline()
    assert first == "CONNECTING\n", first + r1.communicate(timeout=30)[0]
    r0 = start(0, "the job's own secret 0123456789", 3)
    out1 = first + r1.communicate(timeout=300)[0]
    out0 = r0.communicate(timeout=300)[0]
    assert "REFUSED" in out1 and "secret" in out1, out1
    assert "REFUSED FerrocommTimeout" in out0, out0


def test_info():
    run_ranks(2, "info")


def test_settings_that_differ_between_ranks():
    run_ranks(2, "settings")


def test_a_tuning_table_file_changes_the_choice_at_its_sizes(tmp_path):
    """FERROCOMM_TUNING names a table whose two-rank all-reduce goes flat up to 1 KiB only."""
    builtin = HERE.parent.parent / "crates/ferrocomm/src/config/tuning.json"
    table = json.loads(builtin.read_text())
    table["all_reduce"][0].update(worlds="1-2", flat_max="1K")
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    path.chmod(0o600)
    run_ranks(2, "tuning", env={"FERROCOMM_TUNING": str(path), "FERROCOMM_TEST_FLAT_MAX": "1024"})


def test_split_and_two_communicators():
    run_ranks(4, "split")


def test_python_store(tmp_path):
    """new_comm(store=...) with a Python object store; rank and size from keyword arguments."""
    outs = run_ranks(2, "async", env={"FERROCOMM_TEST_FILESTORE": str(tmp_path / "store"),
                                       "MASTER_PORT": ""})
    assert all("async ok" in o for o in outs)
    assert os.listdir(tmp_path / "store"), "the store was not used"


def test_timeout():
    outs = run_ranks(2, "timeout", env={"FERROCOMM_TEST_TIMEOUT": "1"})
    assert "timeout after" in outs[0]


@pytest.mark.parametrize("world", [2])
def test_torch_cpu_tensors(world):
    run_ranks(world, "torch")


@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_rmsnorm(world):
    """The fused all-reduce + residual add + RMSNorm against a float64 numpy reference."""
    outs = run_ranks(world, "rmsnorm", timeout=900)
    assert all("rmsnorm ok" in o for o in outs)


def test_torchcomms_parity():
    """gather_single, per-call timeout, abort, set_timeout, get_options, get_backend_version,
    new_comm's torchcomms argument order, ReduceOp from torch.distributed."""
    run_ranks(2, "parity")


def test_abort_process_on_timeout():
    """abort_process_on_timeout_or_error=True: rank 0's call times out (rank 1 never makes it)
    and the process aborts (SIGABRT) after saying why, naming the missing rank."""
    port = free_port()
    # Rank 1 stays, alive and never calling, until the test closes its stdin after rank 0 has
    # ended.
    code = ("import sys, numpy as np, ferrocomm\n"
            "c = ferrocomm.new_comm('host', 'cpu', 'abort', True, 30)\n"
            "if c.rank == 0:\n"
            "    c.all_reduce(np.ones(8, np.float32), timeout=0.5)\n"
            "    print('RETURNED')\n"
            "else:\n"
            "    sys.stdin.read()\n")

    def start(rank):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        return subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)

    procs = [start(0), start(1)]
    try:
        out0 = procs[0].communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    # communicate closes rank 1's stdin first: it ends.
    outs = [out0, procs[1].communicate(timeout=300)[0]]
    assert procs[0].returncode == -signal.SIGABRT, (procs[0].returncode, outs[0])
    assert "aborting the process" in outs[0] and "waiting for rank 1" in outs[0], outs[0]
    assert "RETURNED" not in outs[0]
    assert procs[1].returncode == 0, outs[1]

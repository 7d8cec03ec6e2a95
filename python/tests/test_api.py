"""In-process checks of the API surface (no peers needed)."""

import datetime
import os
import subprocess
import sys

import numpy as np
import pytest

import ferrocomm
from ferrocomm import ReduceOp


def test_reduce_ops():
    assert ReduceOp.SUM == ReduceOp("sum")
    assert ReduceOp.PRODUCT.native() == ("prod", 1.0)
    p = ReduceOp.PREMUL_SUM(0.5)
    assert p.native() == ("premulsum", 0.5) and p.factor == 0.5
    assert p != ReduceOp.PREMUL_SUM(2.0)
    assert repr(p) == "ReduceOp.PREMUL_SUM(0.5)" and repr(ReduceOp.AVG) == "ReduceOp.AVG"
    assert {ReduceOp.MIN, ReduceOp.MIN, ReduceOp.MAX} == {ReduceOp.MIN, ReduceOp.MAX}
    assert ReduceOp.coerce("bxor") == ReduceOp.BXOR
    with pytest.raises(ferrocomm.FerrocommValueError, match="unknown reduce op"):
        ReduceOp("median")


def test_exception_hierarchy():
    assert issubclass(ferrocomm.FerrocommTimeout, TimeoutError)
    assert issubclass(ferrocomm.FerrocommTimeout, ferrocomm.FerrocommError)
    assert issubclass(ferrocomm.FerrocommValueError, ValueError)
    assert issubclass(ferrocomm.FerrocommError, RuntimeError)


def test_torchcomms_names():
    for m in ["all_reduce", "allreduce", "reduce", "broadcast", "all_gather",
              "all_gather_single", "reduce_scatter", "reduce_scatter_single", "all_to_all",
              "all_to_all_single", "all_to_all_v_single", "barrier", "send", "recv", "split",
              "finalize", "get_rank", "get_size", "get_backend", "get_name", "get_device"]:
        assert callable(getattr(ferrocomm.Comm, m)), m
    assert ferrocomm.TorchComm is ferrocomm.Comm


def _env_without_launch():
    return {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR",
                         "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")}


def test_missing_rank_is_reported():
    code = ("import ferrocomm\n"
            "try:\n    ferrocomm.new_comm('host', 'cpu', 'x')\n"
            "except ferrocomm.FerrocommValueError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=_env_without_launch(),
                         capture_output=True, text=True, timeout=300)
    assert "ERR" in out.stdout and "RANK" in out.stdout, out


def test_bad_arguments_to_new_comm(tmp_path):
    from filestore import FileStore
    st = FileStore(tmp_path)
    with pytest.raises(ferrocomm.FerrocommValueError, match="backend"):
        ferrocomm.new_comm("gloo", "cpu", "x", rank=0, size=1, store=st)
    with pytest.raises(ferrocomm.FerrocommValueError, match="device"):
        ferrocomm.new_comm("host", "tpu:0", "x", rank=0, size=1, store=st)
    with pytest.raises(ferrocomm.FerrocommValueError, match="host backend cannot serve"):
        ferrocomm.new_comm("host", "cuda:0", "x", rank=0, size=1, store=st)
    with pytest.raises(ferrocomm.FerrocommValueError, match="rank 3 is not below size 2"):
        ferrocomm.new_comm("host", "cpu", "x", rank=3, size=2, store=st)
    with pytest.raises(ferrocomm.FerrocommValueError, match="timeout"):
        ferrocomm.new_comm("host", "cpu", "x", rank=0, size=1, store=st, timeout=-1)


def test_store_timeout_when_peers_never_come(tmp_path):
    """Rank 0 of 2 alone: creation fails with FerrocommTimeout within the timeout."""
    from filestore import FileStore
    import time
    t0 = time.monotonic()
    with pytest.raises(ferrocomm.FerrocommTimeout):
        ferrocomm.new_comm("host", "cpu", "lonely", rank=0, size=2, store=FileStore(tmp_path),
                           timeout=datetime.timedelta(seconds=1))
    # The bound is the behaviour under test: the 1 s timeout ends the wait (10 s leaves room
    # for two loaded cores).
    assert time.monotonic() - t0 < 10


def test_single_rank(tmp_path):
    """A communicator of one rank: collectives are copies, the context manager finalizes."""
    from filestore import FileStore
    x = np.random.default_rng(1).standard_normal(10).astype(np.float32)
    with ferrocomm.new_comm("ferrocomm", "cpu", "one", rank=0, size=1,
                            store=FileStore(tmp_path)) as comm:
        assert comm.get_backend() == "host" and comm.size == 1
        t = x.copy()
        comm.all_reduce(t, ReduceOp.SUM)
        np.testing.assert_array_equal(t, x)
        out = np.full(10, -1.0, np.float32)
        w = comm.all_gather_single(out, x, async_op=True)
        w.wait()
        assert w.is_completed()
        np.testing.assert_array_equal(out, x)
    with pytest.raises(ferrocomm.FerrocommError, match="finalized"):
        comm.all_reduce(t)

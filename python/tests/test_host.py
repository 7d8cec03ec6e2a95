"""The Python API on the host backend with real processes (2 and 4 ranks)."""

import os

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("world", [2, 4])
def test_every_method_dtype_and_op(world):
    outs = run_ranks(world, "collectives", timeout=120)
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


def test_info():
    run_ranks(2, "info")


def test_settings_that_differ_between_ranks():
    run_ranks(2, "settings")


def test_split_and_two_communicators():
    run_ranks(4, "split")


def test_python_store(tmp_path):
    """new_comm(store=...) with a Python object store; rank and size from keyword arguments."""
    outs = run_ranks(2, "async", env={"FERROCOMM_TEST_FILESTORE": str(tmp_path / "store"),
                                       "MASTER_PORT": ""})
    assert all("async ok" in o for o in outs)
    assert os.listdir(tmp_path / "store"), "the store was not used"


def test_timeout():
    outs = run_ranks(2, "timeout", env={"FERROCOMM_TEST_TIMEOUT": "1"}, timeout=30)
    assert "timeout after" in outs[0]


@pytest.mark.parametrize("world", [2])
def test_torch_cpu_tensors(world):
    run_ranks(world, "torch")


def test_torchcomms_parity():
    """gather_single, per-call timeout, abort, set_timeout, get_options, get_backend_version,
    new_comm's torchcomms argument order, ReduceOp from torch.distributed."""
    run_ranks(2, "parity")

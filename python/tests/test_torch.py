"""The "ferrocomm" torch.distributed backend on the host backend with real processes: every
collective against gloo in the same processes, async work, groups, low precision, errors.

torch is required: these tests fail (they are not skipped) when it is missing.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_ranks

if importlib.util.find_spec("torch") is None:
    raise ImportError(
        "the torch.distributed backend tests need torch: pip install torch==2.11.0 "
        "(--index-url https://download.pytorch.org/whl/cpu for the CPU-only wheel)")

NO_NCCL = {"FERROCOMM_NCCL_LIB": "/nonexistent"}


def run(world, scenario, timeout=1200):
    outs = run_ranks(world, scenario, env=NO_NCCL, timeout=timeout, script="torch_ranks.py")
    assert all(f"{scenario} ok" in o for o in outs), outs
    return outs


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_against_gloo(world):
    run(world, "collectives")


def test_async_work():
    run(2, "async")


def test_groups_mixed_backends_and_low_precision():
    run(4, "groups")


def test_errors():
    run(2, "errors")


@pytest.mark.parametrize("world", [2, 3])
def test_gaps_found_by_torchs_suite(world):
    """all_gather_coalesced, sparse all_reduce, every c10d ProcessGroup member accounted for,
    coalescing blocks, a barrier's timeout in torch's words."""
    run(world, "gaps")


def test_docs_list_every_unsupported_process_group_call():
    """docs/torch.md's "Not supported" table names every c10d call ferrocomm's group refuses."""
    import ferrocomm.torch as fct

    docs = (Path(__file__).resolve().parents[2] / "docs" / "torch.md").read_text()
    section = docs.split("## Not supported", 1)[1].split("\n## ", 1)[0]
    src = Path(fct.__file__).read_text()
    refused = set(re.findall(r'_unsupported\("(\w+)"', src))
    assert len(refused) >= 9, refused
    missing = sorted(n for n in refused if f"`{n}`" not in section and f".{n}(" not in section)
    assert not missing, f"docs/torch.md's Not supported list lacks {missing}"


def test_import_torch_registers_the_backend():
    """The installed package's torch.backends entry point: no import of ferrocomm needed."""
    code = ("import sys, torch.distributed as dist; "
            "print('FERROCOMM' in dist.Backend._plugins, 'ferrocomm.torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


def test_hints_blocks_nest_and_restore():
    """ferrocomm.torch.hints: inner keys win, the enclosing block's hints come back on exit
    (an exception included), other backends' keys are dropped, and one block cannot be
    entered twice at once."""
    import ferrocomm.torch as fct

    def current():
        return fct._call_hints()

    outer = fct.hints(low_precision="e4m3", unknown_key=1)
    assert current() is None
    with outer:
        assert current() == {"low_precision": "e4m3"}
        with fct.hints(low_precision="off", algo="flat"):
            assert current() == {"low_precision": "off", "algo": "flat"}
        assert current() == {"low_precision": "e4m3"}
        with pytest.raises(RuntimeError, match="entered already"):
            with outer:
                pass
        assert current() == {"low_precision": "e4m3"}
    assert current() is None
    with pytest.raises(KeyError):
        with fct.hints(algo="tree"):
            raise KeyError("inside")
    assert current() is None
    with outer:  # usable again once left
        assert current() == {"low_precision": "e4m3"}

"""torch's own backend test suite (DistributedTest._DistTestBase) against "ferrocomm" on CPU
tensors: every test at 2 ranks, the collective tests at 3 (torch_suite.py runs them; what is
expected not to pass is listed with its reason in torch_suite_expected.txt).

torch (and expecttest and hypothesis, which the suite imports) are required: these tests fail,
not skip, without them.
"""

import re
import subprocess
import sys

import pytest

from conftest import HERE

import torch_suite


def run_suite(*args, timeout):
    cmd = [sys.executable, str(HERE / "torch_suite.py"), *args]
    try:
        out = subprocess.run(cmd, cwd=str(HERE), capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(args)}: the suite did not finish in {timeout}s:\n"
                    f"{e.stdout or ''}{e.stderr or ''}")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-20000:]
    summary = [line for line in out.stdout.splitlines() if " ranks: " in line]
    assert summary and " 0 failed, 0 errors" in summary[-1], text[-20000:]
    return summary[-1]


def test_suite_at_2_ranks():
    summary = run_suite("--world", "2", timeout=900)
    # Most of the suite runs: far more passing tests than a broken hook-up would give.
    passed = int(summary.split(": ", 1)[1].split(" passed")[0])
    assert passed >= 90, summary


def test_collectives_at_3_ranks():
    summary = run_suite("--world", "3", "--only", "collectives", timeout=900)
    passed = int(summary.split(": ", 1)[1].split(" passed")[0])
    assert passed >= 40, summary


def test_a_test_past_its_bound_fails_the_run():
    """A test whose ranks are still running at --timeout is ended and fails (the bound that
    turns a hang into a failure): with --stall-rank 1, rank 1 never starts the barrier test and
    rank 0 waits in it."""
    cmd = [sys.executable, str(HERE / "torch_suite.py"), "--world", "2", "--timeout", "2",
           "--stall-rank", "1", "test_barrier"]
    out = subprocess.run(cmd, cwd=str(HERE), capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-5000:]
    assert "terminated or timed out after" in text, text[-5000:]
    assert "0 passed, 0 failed, 1 errors" in out.stdout, text[-5000:]


# -- the runner's own rules, on made-up outcomes -------------------------------------------------


def test_list_file_lines_and_worlds():
    text = ("# comment\n"
            "skip test_a: needs two GPUs\n"
            "unsupported test_b@3: not at 3\n"
            "left-out test_c@2,4: slow  # trailing comment\n")
    assert torch_suite.parse_expected(text, 2) == {
        "test_a": ("skip", "needs two GPUs"), "test_c": ("left-out", "slow")}
    assert torch_suite.parse_expected(text, 3) == {
        "test_a": ("skip", "needs two GPUs"), "test_b": ("unsupported", "not at 3")}
    for bad in ("skip test_a", "maybe test_a: why", "skip test_a: x\nskip test_a: y",
                "skip not_a_test: why"):
        with pytest.raises(ValueError):
            torch_suite.parse_expected(bad, 2)


def test_every_outcome_outside_the_list_is_a_problem():
    expected = {"test_skipped": ("skip", "r"), "test_gone": ("skip", "r"),
                "test_unsupported": ("unsupported", "r")}
    rows = {
        "test_ok": {"outcome": "pass", "detail": ""},
        "test_failed": {"outcome": "fail", "detail": "AssertionError"},
        "test_errored": {"outcome": "error", "detail": "RuntimeError"},
        "test_skipped_unlisted": {"outcome": "skip", "detail": "no reason"},
        "test_skipped": {"outcome": "pass", "detail": ""},
    }
    names = list(rows) + ["test_unsupported"]
    bad = dict(torch_suite.verdicts(names, rows, expected))
    assert set(bad) == {"test_failed", "test_errored", "test_skipped_unlisted", "test_skipped",
                        "test_gone"}, bad
    assert "no such test" in bad["test_gone"]
    assert "listed as skipped" in bad["test_skipped"]
    rows["test_skipped"] = {"outcome": "skip", "detail": "needs CUDA"}
    ok = dict(torch_suite.verdicts(names, rows, expected))
    assert "test_skipped" not in ok


def test_the_list_file_parses_and_names_real_tests():
    """Every entry of torch_suite_expected.txt parses, has a reason, and names a test of the
    installed torch's suite (the runner checks this too, at its start)."""
    text = torch_suite.EXPECTED.read_text()
    for world in (2, 3):
        entries = torch_suite.parse_expected(text, world)
        assert len(entries) > 50
        assert all(reason.strip() for _, reason in entries.values())


def test_docs_not_supported_list_matches_what_the_suite_skips():
    """Every test the list marks unsupported (or skips for a documented limit) names, in
    backticks, a row of docs/torch.md's "Not supported" table."""
    docs = (HERE.parents[1] / "docs" / "torch.md").read_text()
    section = docs.split("## Not supported", 1)[1].split("\n## ", 1)[0]
    entries = torch_suite.parse_expected(torch_suite.EXPECTED.read_text(), 2)
    documented = [(n, r) for n, (k, r) in entries.items()
                  if k == "unsupported" or "docs/torch.md" in r]
    assert len(documented) >= 6, documented
    for name, reason in documented:
        term = re.search(r"`([^`]+)`", reason)
        assert term, f"{name}: the reason names no documented call in backticks: {reason}"
        assert f"`{term.group(1)}`" in section, f"{name}: docs/torch.md lacks {term.group(1)}"

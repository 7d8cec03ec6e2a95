"""torch's own backend test suite against the "ferrocomm" backend on CPU tensors.

    python torch_suite.py --world 2 [--only collectives] [--start-method fork|spawn]
                          [--timeout S] [--json FILE] [TEST_NAME ...]

Runs ``DistributedTest._DistTestBase`` of torch/testing/_internal/distributed/distributed_test.py
the way torch's test/distributed/test_distributed_spawn.py drives it for its own backends
(BACKEND, WORLD_SIZE and TEMP_DIR in the environment, one process per rank for every test), with
"ferrocomm" added to the suite's backend feature lists here (torch is not edited). Every test
is bounded: a rank that does not finish in --timeout seconds fails the test.

torch_suite_expected.txt lists what is expected not to pass, with the reason for each. The run
fails (exit 1) when a test outside it fails, errors or is skipped, when a test it expects to be
skipped passes or fails instead, or when it names a test the suite does not have.
test_torch_suite.py runs this at 2 ranks and the collective tests at 3.
"""

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import time
import types
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "torch_suite_expected.txt"

# What --only collectives selects: the tests of the collectives themselves (the ones whose
# behaviour depends on the number of ranks), not DDP, profiling, or the process group's setup.
COLLECTIVE = re.compile(
    r"^test_(all_reduce|reduce|broadcast|all_gather|gather|scatter|reduce_scatter|all_to_all|"
    r"barrier|batch_isend_irecv|send_recv|isend|irecv|.*_object|allgather|sparse_all_reduce)")

KINDS = ("skip", "unsupported", "left-out")

# Tests the suite skips for every backend but the named ones by a literal test on BACKEND rather
# than by a feature list, where ferrocomm does what they test on CPU tensors: the runner runs
# them (keyed by the skip's reason, so that a change of torch's gate shows up as a skip).
RUN_ANYWAY = {
    "Test requires backend ferrocomm to be one of {'gloo'}":
        "all_reduce_coalesced, scatter_object_list, no_sync: gloo's CPU features",
    "Only MPI supports all_to_all": "all_to_all on CPU tensors",
    "Only MPI supports CPU all_to_all_single": "all_to_all_single on CPU tensors",
    "Only gloo backend supports timeouts": "a barrier's timeout",
    "GLOO Batch Send Recv CPU": "batch_isend_irecv on CPU tensors",
    "get_future is only supported on mpi, nccl and gloo": "Work.get_future",
    "Only Gloo backend support sparse all reduce": "sparse all-reduce (sum by indices)",
}


def parse_expected(text, world):
    """{test name: (kind, reason)} for `world` ranks from the list file's text.

    A line is ``KIND NAME[@WORLDS]: REASON`` (WORLDS: sizes joined by commas, every size when
    absent); ``#`` starts a comment. KIND is ``skip`` (the suite itself skips it here: it runs
    and must be skipped; one the ranks decide, rather than a decorator, runs only with
    --check-skips), ``unsupported`` (ferrocomm does not do what it tests: not run) or
    ``left-out`` (not run, for the test command's time)."""
    out = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+(test_\w+)(?:@([\d,]+))?\s*:\s*(\S.*)", line)
        if m is None or m.group(1) not in KINDS:
            raise ValueError(f"{EXPECTED.name}:{n}: expected 'KIND test_name[@N,..]: reason' "
                             f"with KIND one of {', '.join(KINDS)}; got {raw!r}")
        kind, name, worlds, reason = m.groups()
        if worlds and world not in {int(w) for w in worlds.split(",")}:
            continue
        if name in out:
            raise ValueError(f"{EXPECTED.name}:{n}: {name} is listed twice for {world} ranks")
        out[name] = (kind, reason)
    return out


def prepare_env(world, timeout, tmp):
    """The environment torch's suite reads at import (each test then makes a TEMP_DIR of its
    own)."""
    os.environ["BACKEND"] = "ferrocomm"
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["TEMP_DIR"] = tmp
    os.makedirs(os.path.join(tmp, "barrier"), exist_ok=True)
    # Read by common_distributed at import: how long the parent waits for the ranks of a test.
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)
    # No GPU here; and on a GPU machine this suite still runs on CPU tensors only.
    os.environ.setdefault("FERROCOMM_NCCL_LIB", "/nonexistent")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    # As torch's CI runs the suite: a file store, which test_barrier_timeout_global
    # initializes again by this name (TestDistBackend uses a file of its own per test).
    os.environ["INIT_METHOD"] = "file://" + os.path.join(os.environ["TEMP_DIR"], "init_file")


def add_ferrocomm_to_feature_lists():
    """The suite's backend lists, as they stand for a backend torch ships, before the test
    class is built (its skip decorators read them then)."""
    from torch.testing._internal.common_distributed import DistTestCases

    import ferrocomm.torch  # noqa: F401 (registers the backend)

    for feature in ("gpu", "cuda", "ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("ferrocomm")
    # A receive from any source is not supported (docs/torch.md).
    DistTestCases.skip_collective["sendrecv anysource"].add("ferrocomm")
    # The suite logs every process it starts (its logger's level is set at its import).
    logging.getLogger("torch.testing._internal.common_distributed").setLevel(logging.WARNING)


def test_class(start_method, expected):
    import torch.multiprocessing as mp
    from torch.testing._internal.distributed.distributed_test import (DistributedTest,
                                                                      TestDistBackend)

    class TestDistBackendFerrocomm(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            # fork: the ranks start without importing torch again (a second per rank per
            # test on a loaded machine); spawn: as torch's own driver does.
            self._start_processes(mp.get_context(start_method).Process)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            # --stall-rank: this rank never starts its test (how the bound on a test that hangs
            # is itself checked).
            if os.environ.get(STALL) == str(rank):
                time.sleep(3600)
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    # spawn pickles the test's class by name: the ranks find it in this module (imported
    # again there, see the end of the file).
    TestDistBackendFerrocomm.__module__ = __name__
    TestDistBackendFerrocomm.__qualname__ = "TestDistBackendFerrocomm"
    globals()["TestDistBackendFerrocomm"] = TestDistBackendFerrocomm
    for name in unittest.TestLoader().getTestCaseNames(TestDistBackendFerrocomm):
        f = getattr(TestDistBackendFerrocomm, name)
        # Unless the list says the test stays skipped (it cannot run for ferrocomm as written).
        if (getattr(f, "__unittest_skip_why__", None) in RUN_ANYWAY
                and expected.get(name, (None,))[0] != "skip"):
            setattr(TestDistBackendFerrocomm, name, unskipped(f))
    return TestDistBackendFerrocomm


def unskipped(f):
    """A copy of test function `f` without its skip mark (torch's function is left as it is)."""
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__dict__.update(f.__dict__)
    g.__unittest_skip__ = False
    del g.__unittest_skip_why__
    g.__qualname__ = f.__qualname__
    return g


class Outcomes(unittest.TestResult):
    """Each test's outcome (pass, skip, fail, error), its detail and its seconds, printed as
    they come."""

    def __init__(self):
        super().__init__()
        self.rows = {}
        self._t0 = 0.0

    def startTest(self, test):  # noqa: N802 (unittest's spelling)
        super().startTest(test)
        self._t0 = time.monotonic()

    def _record(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        secs = time.monotonic() - self._t0
        self.rows[name] = {"outcome": outcome, "detail": detail, "seconds": round(secs, 2)}
        first = detail.strip().splitlines()[-1] if detail.strip() else ""
        print(f"{outcome:5} {secs:6.1f}s {name} {first[:160]}", flush=True)

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._record(test, "pass")

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))


def verdicts(names, rows, expected):
    """The problems of a run: (test, what went wrong) for every test whose outcome the list
    does not allow."""
    bad = []
    for name in sorted(set(expected) - set(names)):
        bad.append((name, f"listed in {EXPECTED.name} but the suite has no such test"))
    for name, row in sorted(rows.items()):
        kind = expected.get(name, (None,))[0]
        outcome = row["outcome"]
        if kind is None and outcome != "pass":
            bad.append((name, f"{outcome} and not in {EXPECTED.name}: {row['detail']}"))
        elif kind == "skip" and outcome != "skip":
            bad.append((name, f"listed as skipped here but it ended '{outcome}' "
                              f"{row['detail']}".rstrip()))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--only", choices=["collectives"], help="run only the collective tests")
    ap.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    ap.add_argument("--timeout", type=int, default=90,
                    help="seconds a test's ranks have to finish (a hang fails the test)")
    ap.add_argument("--json", help="write every test's outcome here")
    ap.add_argument("--all", action="store_true",
                    help="run the tests the list leaves out or marks unsupported too")
    ap.add_argument("--check-skips", action="store_true",
                    help="also start the listed skips that the ranks decide (to check them)")
    ap.add_argument("--stall-rank", type=int, metavar="R",
                    help="rank R sleeps instead of running each test (checks the --timeout bound)")
    ap.add_argument("tests", nargs="*", help="run only these tests")
    args = ap.parse_args(argv)
    if args.world < 2:
        ap.error("--world must be at least 2")

    with tempfile.TemporaryDirectory(prefix="ferrocomm-suite-") as tmp:
        return run(args, ap, tmp)


def run(args, ap, tmp):
    prepare_env(args.world, args.timeout, tmp)
    os.environ[SPAWNED] = args.start_method
    if args.stall_rank is not None:
        os.environ[STALL] = str(args.stall_rank)
    add_ferrocomm_to_feature_lists()
    expected = parse_expected(EXPECTED.read_text(), args.world)
    cls = test_class(args.start_method, expected)
    names = unittest.TestLoader().getTestCaseNames(cls)
    unknown = [t for t in args.tests if t not in names]
    if unknown:
        ap.error(f"no such test in the suite: {', '.join(unknown)}")

    chosen = []
    for name in args.tests or names:
        if args.only == "collectives" and not COLLECTIVE.match(name):
            continue
        kind = expected.get(name, (None,))[0]
        if kind in ("unsupported", "left-out") and not (args.all or args.tests):
            continue
        # A listed skip decided by a decorator costs nothing (no rank starts); one decided in
        # the ranks (no GPU, world size) starts them and initializes the group first, about a
        # second each on a loaded 2-core machine: those run with --check-skips.
        decided_early = getattr(getattr(cls, name), "__unittest_skip__", False)
        if kind == "skip" and not decided_early and not (args.check_skips or args.tests):
            continue
        chosen.append(name)

    print(f"torch suite against ferrocomm: {args.world} ranks, {len(chosen)} of {len(names)} "
          f"tests ({args.start_method})", flush=True)
    t0 = time.monotonic()
    result = Outcomes()
    unittest.TestSuite(cls(n) for n in chosen).run(result)
    secs = time.monotonic() - t0

    bad = verdicts(names, result.rows, expected) if not args.tests else [
        (n, r["outcome"] + " " + r["detail"]) for n, r in result.rows.items()
        if r["outcome"] != "pass" and expected.get(n, (None,))[0] != "skip"]
    counts = {k: sum(r["outcome"] == k for r in result.rows.values())
              for k in ("pass", "skip", "fail", "error")}
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"world": args.world, "seconds": round(secs, 1), "counts": counts,
             "tests": result.rows, "problems": bad}, indent=1))
    for name, why in bad:
        print(f"PROBLEM {name}: {why}")
    print(f"{args.world} ranks: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['error']} errors, {counts['skip']} skipped in {secs:.0f} s; "
          f"{len(bad)} outside {EXPECTED.name}", flush=True)
    return 1 if bad else 0


# Set by the runner for its ranks: a rank started by spawn imports this file again (not as
# __main__) and needs the test class before it unpickles its test.
SPAWNED = "FERROCOMM_TORCH_SUITE_START"
# Set by --stall-rank for the ranks.
STALL = "FERROCOMM_TORCH_SUITE_STALL_RANK"

if __name__ == "__main__":
    sys.exit(main())
elif os.environ.get(SPAWNED) == "spawn":
    add_ferrocomm_to_feature_lists()
    test_class("spawn", {})

"""How every rank script of the tests ends: runs the scenario named on its command line and
says so; any exception is printed and the process leaves at once with status 1 (without waiting
for its threads or its communicator's teardown, which a peer's failure could hang)."""

import os
import sys
import traceback


def run(rank, scenario, body):
    """Runs `body()` for `scenario` on rank `rank`; prints `rank R: SCENARIO ok` after it."""
    try:
        body()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    print(f"rank {rank}: {scenario} ok", flush=True)

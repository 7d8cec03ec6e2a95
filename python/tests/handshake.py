"""Handshakes between the processes of a multi-process test, so that no test sleeps to order
events: a file one rank creates and the other waits for, and whether a thread of another process
is asleep in the kernel (blocked in the wait under test).

Every wait has a deadline that only a rank that never gets there reaches."""

import os
import tempfile
import time

PATIENCE_S = 60


def path(name):
    """A file the ranks of this run (one MASTER_PORT) agree on."""
    return os.path.join(tempfile.gettempdir(),
                        f"ferrocomm-test-{os.environ['MASTER_PORT']}-{name}")


def clear(name):
    """Removes the file `name` if an earlier run left it (before the ranks meet, so that none
    can take it for this run's)."""
    try:
        os.unlink(path(name))
    except FileNotFoundError:
        pass


def arrive(name):
    """Creates the file `name` that another rank waits for."""
    with open(path(name), "w"):
        pass


def _until(cond, what):
    deadline = time.monotonic() + PATIENCE_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {PATIENCE_S} s for {what}")
        # The pause between two looks (a wait for a condition, with the deadline above).
        time.sleep(0.0002)


def wait_for(name, what):
    """Waits until another rank has created the file `name`, then removes it."""
    _until(lambda: os.path.exists(path(name)), what)
    os.unlink(path(name))


def state(pid, tid=None):
    """The state letter of thread `tid` (default: the main thread) of process `pid` ('R'
    running, 'S' asleep, ...), None once it has ended."""
    try:
        with open(f"/proc/{pid}/task/{tid or pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    # The state follows the parenthesised name, which may itself hold parentheses.
    return stat.rpartition(")")[2].split()[0]


def wait_until_asleep(pid, what):
    """Waits until the main thread of process `pid` is asleep: once it has told us it is about
    to make the call under test (and makes no other call that could block before it), it is
    then asleep in that call's wait."""
    def asleep():
        s = state(pid)
        if s is None:
            raise AssertionError(f"process {pid} ended before {what}")
        return s == "S"
    _until(asleep, what)

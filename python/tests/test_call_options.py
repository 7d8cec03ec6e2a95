"""Per-call options travel with the call: one communicator called from two threads at once,
each call with its own timeout, and each call's description carries its own (the communicator
stores none)."""

import threading

import numpy as np

import ferrocomm
from filestore import FileStore

DEADLINE = 20.0


class _Recording:
    """The real native communicator, its calls recorded: (thread name, call name, timeout of
    the description). The call of the thread named `hold` waits inside the native layer until
    `release` is set, so that the other thread's whole call happens while it is in flight."""

    def __init__(self, native, hold, release, inside):
        self._native = native
        self._hold = hold
        self._release = release
        self._inside = inside
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._native, name)

    def run(self, call, async_op, mark):
        name = threading.current_thread().name
        # call = (name, output, input, (op, factor), peer, (stream, algo, lp, timeout), ...)
        self.calls.append((name, call[0], call[5][3]))
        if name == self._hold:
            self._inside.set()
            assert self._release.wait(DEADLINE), "the other thread's call never finished"
        return self._native.run(call, async_op, mark)


def _two_threads(comm, first, second):
    """Runs `first` on thread "first", which stays inside its native call until `second` (on
    thread "second", started once `first` is inside) has returned; re-raises either's error."""
    inside, release = threading.Event(), threading.Event()
    spy = _Recording(comm._n, "first", release, inside)
    comm._n = spy
    errors = []

    def run(f, after=None):
        try:
            f()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)
        finally:
            if after is not None:
                after.set()

    t1 = threading.Thread(target=run, args=(first,), name="first")
    t1.start()
    assert inside.wait(DEADLINE), "the first call never reached the native layer"
    t2 = threading.Thread(target=run, args=(second, release), name="second")
    t2.start()
    t2.join(DEADLINE)
    t1.join(DEADLINE)
    assert not t1.is_alive() and not t2.is_alive()
    comm._n = spy._native
    if errors:
        raise errors[0]
    return spy.calls


def test_each_thread_s_call_carries_its_own_timeout(tmp_path):
    with ferrocomm.new_comm("host", "cpu", "options", rank=0, size=1, timeout=30,
                            store=FileStore(tmp_path)) as comm:
        x = np.arange(8, dtype=np.float32)
        out = np.empty(8, np.float32)
        # A call with a timeout in flight while another without one runs: the second must not
        # see the first's (a timeout kept on the communicator would leak into it), and
        # neither may change the communicator's.
        calls = _two_threads(
            comm,
            lambda: comm.all_reduce(x, timeout=2.5),
            lambda: comm.all_gather_single(out, x),
        )
        assert sorted(calls) == [("first", "all_reduce", 2.5), ("second", "all_gather", None)]
        np.testing.assert_array_equal(out, x)
        assert comm.get_timeout().total_seconds() == 30
        # Two different timeouts at once, in either order of arrival.
        calls = _two_threads(
            comm,
            lambda: comm.barrier(timeout=0.75),
            lambda: comm.broadcast(x, 0, timeout=4),
        )
        assert sorted(calls) == [("first", "barrier", 0.75), ("second", "broadcast", 4.0)]
        calls = _two_threads(
            comm,
            lambda: comm.all_reduce(x),
            lambda: comm.reduce(x, 0, timeout=1.5),
        )
        assert sorted(calls) == [("first", "all_reduce", None), ("second", "reduce", 1.5)]
        # A timeout that is not positive is refused by the call that gave it, naming it.
        for bad in (0, -1.0):
            try:
                comm.all_reduce(x, timeout=bad)
            except ferrocomm.FerrocommValueError as e:
                assert "all_reduce: timeout must be positive" in str(e), e
            else:
                raise AssertionError(f"timeout={bad} was accepted")


def test_every_collective_takes_a_timeout():
    """The torchcomms methods all take ``timeout``, declared (not patched in): right after
    ``hints``, positional or keyword, as torchcomms' signatures have it; ferrocomm's own fused
    call takes it as a keyword."""
    import inspect

    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single",
                 "all_gather_v", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_v",
                 "all_to_all", "all_to_all_single", "all_to_all_v_single", "all_to_all_v_dynamic",
                 "device_alltoallv_single", "gather", "gather_single", "scatter", "barrier",
                 "send", "recv", "all_gather_p_exec", "all_reduce_rmsnorm"):
        params = list(inspect.signature(getattr(ferrocomm.Comm, name)).parameters.values())
        names = [p.name for p in params]
        assert "timeout" in names, name
        p = params[names.index("timeout")]
        assert p.default is None, name
        if name == "all_reduce_rmsnorm":
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
        else:
            assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
            assert names[names.index("timeout") - 1] == "hints", name
    assert ferrocomm.Comm.allreduce is ferrocomm.Comm.all_reduce
    assert "_call_timeout" not in ferrocomm.Comm.__init__.__code__.co_names

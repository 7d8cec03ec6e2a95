"""The work objects collectives return (torchcomms' TorchWork)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from . import _native
from . import _tensors as T
from ._errors import FerrocommPeerFailed
from ._timeouts import TimeoutLike, timeout_seconds

__all__ = ["Work"]


class Work:
    """What a collective returns (torchcomms' TorchWork).

    ``wait()`` orders the caller's current CUDA stream after the collective (no host block) or,
    on the host backend, blocks until it has finished; ``wait_blocking()`` blocks the host in
    both cases; ``is_completed()`` polls.
    """

    def wait(self, timeout: TimeoutLike = None) -> None:
        raise NotImplementedError

    def wait_blocking(self, timeout: TimeoutLike = None) -> None:
        self.wait(timeout)

    def is_completed(self) -> bool:
        raise NotImplementedError


class DoneWork(Work):
    """A call issued with ``async_op=False``: complete on the host, or ordered on the caller's
    stream already."""

    def wait(self, timeout: TimeoutLike = None) -> None:
        return None

    def is_completed(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Work(completed)"


# What every call issued with async_op=False returns: it holds nothing, so one object serves all.
DONE = DoneWork()


class HostWork(Work):
    """A host collective running on the communicator's work thread."""

    def __init__(self, native: _native.NativeWork, keep: Sequence[Any],
                 post: Sequence[Callable[[], None]], limit: Optional[float] = None) -> None:
        self._native = native
        self._keep = keep
        self._post = post
        self._limit = limit

    def wait(self, timeout: TimeoutLike = None) -> None:
        self._native.wait(self._limit if timeout is None else timeout_seconds(timeout))
        # Results of list variants are copied out of the staging buffer here, once.
        post, self._post = self._post, ()
        for f in post:
            f()
        self._keep = ()

    def is_completed(self) -> bool:
        return self._native.is_completed()

    def __repr__(self) -> str:
        return f"Work(host, completed={self.is_completed()})"


class CudaWork(Work):
    """A CUDA collective: a completion (a pooled CUDA event of the native layer) recorded on
    the issuing stream right after it."""

    __slots__ = ("_done", "_device", "_stream", "_keep", "_limit", "_comm")

    def __init__(self, done: _native.Completion, device: int, stream: int, keep: Sequence[Any],
                 limit: Optional[float] = None, comm: Optional[_native.Comm] = None) -> None:
        self._done = done
        self._device = device
        self._stream = stream
        self._keep = keep
        self._limit = limit
        self._comm = comm

    def _check_peers(self) -> None:
        """A peer that died or gave up ended the call's kernels early: its result is not one."""
        if self._comm is not None:
            peer = self._comm.failed_peer()
            if peer is not None:
                raise FerrocommPeerFailed(
                    f"rank {peer} failed or exited while this call was running on rank "
                    f"{self._comm.rank} (flight recorder dumps: {self._comm.trace_dir})")

    def wait(self, timeout: TimeoutLike = None) -> None:
        del timeout  # ordering the stream does not block the host
        self._check_peers()
        cur = T.current_stream_handle(T._torch(), self._device)
        # On the issuing stream the order holds already.
        if cur != self._stream:
            self._done.order(cur)

    def wait_blocking(self, timeout: TimeoutLike = None) -> None:
        self._done.wait(self._limit if timeout is None else timeout_seconds(timeout))
        self._keep = ()
        self._check_peers()

    def is_completed(self) -> bool:
        return self._done.is_completed()

    def __repr__(self) -> str:
        return f"Work(cuda:{self._device})"


class WithOutputs(Work):
    """An ``async_op=True`` call with outputs of its own (the fused call): ``wait()`` as the
    call's work, ``result()`` the outputs."""

    def __init__(self, work: Work, outputs: tuple[Any, ...]) -> None:
        self._work = work
        self._outputs = outputs

    def wait(self, timeout: TimeoutLike = None) -> None:
        self._work.wait(timeout)

    def wait_blocking(self, timeout: TimeoutLike = None) -> None:
        self._work.wait_blocking(timeout)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def result(self) -> tuple[Any, ...]:
        """The outputs, as the call with ``async_op=False`` returns them (valid after wait)."""
        return self._outputs

    def __repr__(self) -> str:
        return repr(self._work)

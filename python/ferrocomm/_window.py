"""One-sided communication: windows (torchcomms' TorchCommWindow), the persistent all-gather
(NCCLX's all_gather_p) and the shared host memory the host backend's windows need.

A window is made by ``comm.new_window()`` on every rank in the same order; ``tensor_register``
is collective (every rank registers a tensor of the same dtype and number of elements, and
every rank maps every peer's). Then ``put`` writes into a peer's tensor with no call on the
peer's side, ``signal`` tells a peer that the puts before it are done, and ``wait_signal``
waits for a peer's signal: once it returns (on CUDA: for later work on the waiting stream) what
the peer put before signalling is visible. On CUDA every call is enqueued on the current
stream and is capturable in a CUDA graph; on the host backend calls run on the calling thread
(``async_op=True``: on the communicator's work thread, in order with its collectives).
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from . import _native
from . import _tensors as T
from ._comm import (_MAX_COUNT, Buffer, Comm, Hints, _alias, _bool_arg, _check_hints, _int_arg,
                    _rank_arg)
from ._errors import FerrocommError, FerrocommValueError
from ._timeouts import TimeoutLike, positive_seconds
from ._work import DONE, CudaWork, HostWork, Work

if TYPE_CHECKING:
    # A native window call: (stream, queue on the host work thread, mark a CUDA completion) ->
    # its work, or None once issued.
    _NativeCall = Callable[[int, bool, bool], _native.Issued]

__all__ = ["AllGatherPHandle", "TorchCommWinAccessType", "TorchCommWindowAttr", "Window",
           "shared_empty"]


class TorchCommWinAccessType(enum.Enum):
    """How a rank reaches a peer's window buffer (torchcomms' names)."""

    WIN_ACCESS_TYPE_UNIFIED = 0
    WIN_ACCESS_TYPE_SEPARATE = 1


class TorchCommWindowAttr:
    """What ``Window.get_attr(peer_rank)`` returns: ``access_type``."""

    __slots__ = ("access_type",)

    def __init__(self, access_type: TorchCommWinAccessType =
                 TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED) -> None:
        self.access_type = access_type

    def __repr__(self) -> str:
        return f"TorchCommWindowAttr(access_type={self.access_type})"


class _Holder:
    """Raw memory as numpy sees it (``__array_interface__``), kept alive by the array made over
    it: it holds `owner`, the object whose life the memory's is."""

    def __init__(self, owner: object, ptr: int, nbytes: int) -> None:
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


class _CudaHolder:
    """Device memory as torch sees it (``__cuda_array_interface__``, bytes: it loses bf16 and
    fails on fp8, so the tensor made over it is viewed as the dtype afterwards)."""

    def __init__(self, owner: object, ptr: int, nbytes: int) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,),
                                         "typestr": "|u1", "version": 2}


def _is_torch_dtype(dtype: object) -> bool:
    torch = T._torch()
    return torch is not None and isinstance(dtype, torch.dtype)


def shared_empty(shape: int | Sequence[int], dtype: Any) -> Any:
    """Host memory a window on the host backend can register: a numpy array (``dtype`` a numpy
    dtype or its name) or a CPU torch tensor (``dtype`` a ``torch.dtype``) of ``shape``, zeroed,
    in shared memory the ranks of the communicator map (a segment of this process under
    /dev/shm, this user's only, while the array lives). CUDA windows need no such thing: any
    tensor from torch's default caching allocator registers."""
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise FerrocommValueError(f"shared_empty: a negative dimension in shape {shape}")
    torch = T._torch()
    if _is_torch_dtype(dtype):
        itemsize: int = torch.empty(0, dtype=dtype).element_size()
    else:
        try:
            itemsize = np.dtype(dtype).itemsize
        except TypeError as e:
            raise FerrocommValueError(f"shared_empty: dtype {dtype!r}: {e}") from None
    nbytes = math.prod(shape) * itemsize
    if nbytes > _MAX_COUNT:
        raise FerrocommValueError(f"shared_empty: {nbytes} bytes is more than memory holds")
    mem = _native.shared_alloc(max(nbytes, 1))
    raw = np.asarray(_Holder(mem, mem.ptr, mem.nbytes))[:nbytes]
    if _is_torch_dtype(dtype):
        return torch.from_numpy(raw).view(dtype).reshape(shape)
    return raw.view(np.dtype(dtype)).reshape(shape)


def _run(comm: Comm, c: str, f: _NativeCall, async_op: object, timeout: TimeoutLike,
         keep: Sequence[Any]) -> Work:
    """Runs native call `f(stream, native_async, mark)` of `comm` as its collectives run: on
    CUDA on the current stream (a completion marked after it for ``async_op``), on the host
    backend queued on the work thread for ``async_op``. Returns the work object; `keep` is what
    it holds until done, `timeout` what bounds its blocking wait."""
    queue = _bool_arg(c, "async_op", async_op)
    limit = positive_seconds(c, timeout)
    cuda = comm._cuda
    stream = comm._stream(c) if cuda else 0
    try:
        native_work = f(stream, queue and not cuda, queue and cuda)
    except FerrocommError as e:
        comm._failed(c, e)
        raise
    if isinstance(native_work, _native.Completion):
        return CudaWork(native_work, comm._n.device_index, stream, keep, limit)
    if native_work is not None:
        return HostWork(native_work, keep, (), limit)
    return DONE


def _raw(b: T.Buf, c: str) -> _native.RawBuf:
    """A described buffer as the native layer takes it (dtypes moved as another carry that
    name)."""
    name, _ = _alias(c, b, "sum")
    return (b.ptr, b.count, name, b.device)


class Window:
    """A window of a communicator (torchcomms' TorchCommWindow); ``comm.new_window()``."""

    def __init__(self, comm: Comm, native: _native.Window) -> None:
        self._comm = comm
        self._n = native
        # The registered tensor (None when registered with owning=False), and what describes
        # it: (dtype object, shape, device, numpy?).
        self._tensor: Optional[Buffer] = None
        self._meta: Optional[tuple[Any, tuple[int, ...], Any, bool]] = None

    # -- the registered buffer -------------------------------------------------------------

    @property
    def dtype(self) -> Any:
        """The registered tensor's dtype (None before ``tensor_register``)."""
        return None if self._meta is None else self._meta[0]

    @property
    def shape(self) -> Optional[list[int]]:
        """The registered tensor's shape, as a list (None before ``tensor_register``)."""
        return None if self._meta is None else list(self._meta[1])

    @property
    def device(self) -> Any:
        """The registered tensor's device (None before ``tensor_register``)."""
        return None if self._meta is None else self._meta[2]

    def get_buf_dtype(self) -> Any:
        return self.dtype

    def get_buf_shape(self) -> Optional[list[int]]:
        return self.shape

    def get_buf_device(self) -> Any:
        return self.device

    def get_size(self) -> int:
        """The registered tensor's size in bytes (0 before ``tensor_register``)."""
        return self._n.size_bytes

    def get_tensor(self) -> Optional[Buffer]:
        """The registered tensor, or None (none registered, or registered with
        ``owning=False``)."""
        return self._tensor

    def tensor_register(self, tensor: Buffer, owning: bool = True) -> None:
        """Registers ``tensor`` (contiguous, on the communicator's device): collective. Every
        rank registers a tensor of the same dtype and number of elements, and every peer maps
        it. On CUDA the memory must come from cudaMalloc (torch's default caching allocator),
        on the host backend from ``ferrocomm.shared_empty``. With ``owning=False`` the window
        does not keep the tensor alive: the caller must, until ``tensor_deregister``. Refused
        on every rank, nothing registered, when a rank's tensor does not qualify or the ranks'
        tensors differ."""
        c = "tensor_register"
        comm = self._comm
        owning = _bool_arg(c, "owning", owning)
        b = comm._buf(tensor, "tensor", c, writable=True)
        try:
            self._n.register(_raw(b, c))
        except FerrocommError as e:
            comm._failed(c, e)
            raise
        numpy = isinstance(tensor, np.ndarray)
        device = "cpu" if numpy else tensor.device
        self._meta = (tensor.dtype, tuple(tensor.shape), device, numpy)
        # The registered memory must outlive the registration: with owning=True the window
        # holds the tensor; the native side relies on it.
        self._tensor = tensor if owning else None

    def tensor_deregister(self) -> None:
        """Releases the registered tensor: collective. Every rank's window calls before it
        finish first (on CUDA the device is synchronized; not during graph capture); tensors
        from ``map_remote_tensor`` are invalid afterwards."""
        c = "tensor_deregister"
        try:
            self._n.deregister()
        except FerrocommError as e:
            self._comm._failed(c, e)
            raise
        self._tensor = None
        self._meta = None

    # -- one-sided operations ----------------------------------------------------------------

    def put(self, tensor: Buffer, dst_rank: int, target_offset_nelems: int,
            async_op: bool = False, hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """Writes ``tensor`` into rank ``dst_rank``'s registered tensor at element
        ``target_offset_nelems`` (its flat index), with no call on ``dst_rank``'s side.
        ``tensor`` has the window's dtype and must lie inside the target from that offset
        (refused, nothing written, otherwise). ``dst_rank`` may be this rank."""
        c = "put"
        _check_hints(hints, c)
        raw = _raw(self._comm._buf(tensor, "tensor", c), c)
        dst = _rank_arg(c, "dst_rank", dst_rank, self._comm.size)
        off = _int_arg(c, "target_offset_nelems", target_offset_nelems, 0, _MAX_COUNT)
        return _run(self._comm, c, lambda s, a, m: self._n.put(raw, dst, off, s, a, m), async_op,
                    timeout, (tensor,))

    def signal(self, peer_rank: int, async_op: bool = False, hints: Hints = None,
               timeout: TimeoutLike = None) -> Work:
        """Signals rank ``peer_rank`` after this rank's puts to it: its next
        ``wait_signal(this rank)`` returns, and those puts are visible to it then."""
        c = "signal"
        _check_hints(hints, c)
        peer = _rank_arg(c, "peer_rank", peer_rank, self._comm.size)
        return _run(self._comm, c, lambda s, a, m: self._n.signal(peer, s, a, m), async_op,
                    timeout, ())

    def wait_signal(self, peer_rank: int, async_op: bool = False, hints: Hints = None,
                    timeout: TimeoutLike = None) -> Work:
        """Waits for the next signal from rank ``peer_rank`` (on CUDA the current stream waits;
        the host does not). ``timeout`` (else the communicator's) bounds the wait: one that
        runs out raises FerrocommTimeout naming the peer (on CUDA at the communicator's next
        call) and aborts the communicator; ``abort()`` ends a wait."""
        c = "wait_signal"
        _check_hints(hints, c)
        peer = _rank_arg(c, "peer_rank", peer_rank, self._comm.size)
        t = positive_seconds(c, timeout)
        return _run(self._comm, c, lambda s, a, m: self._n.wait_signal(peer, s, a, m, t),
                    async_op, timeout, ())

    def map_remote_tensor(self, rank: int) -> Any:
        """Rank ``rank``'s registered tensor as mapped in this process (this rank's own: the
        registered memory), with the registered dtype and shape. Peers write into it at any
        time: read what a peer put after ``wait_signal`` for its signal. Invalid after
        ``tensor_deregister``."""
        c = "map_remote_tensor"
        r = _rank_arg(c, "rank", rank, self._comm.size)
        if self._meta is None:
            raise FerrocommValueError(f"{c}: no tensor is registered in this window")
        ptr = self._n.remote_ptr(r)
        dtype, shape, device, numpy = self._meta
        nbytes = self._n.size_bytes
        if numpy:
            return np.asarray(_Holder(self, ptr, nbytes)).view(dtype).reshape(shape)
        torch = T._torch()
        if device.type == "cpu":
            raw = torch.from_numpy(np.asarray(_Holder(self, ptr, nbytes)))
        else:
            raw = torch.as_tensor(_CudaHolder(self, ptr, nbytes), device=device)
        return raw.view(dtype).reshape(shape)

    def get_attr(self, peer_rank: int) -> TorchCommWindowAttr:
        """How this rank reaches ``peer_rank``'s tensor: every peer's is mapped
        (``WIN_ACCESS_TYPE_UNIFIED``)."""
        c = "get_attr"
        peer = _rank_arg(c, "peer_rank", peer_rank, self._comm.size)
        kind = self._n.access_type(peer)
        return TorchCommWindowAttr(TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED
                                   if kind == "unified"
                                   else TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE)

    def __repr__(self) -> str:
        if self._meta is None:
            return "Window(unregistered)"
        return f"Window({self.dtype}, shape={self.shape}, device={self.device})"


class AllGatherPHandle:
    """A persistent all-gather (what ``all_gather_p_init`` returns): the output is registered
    once and every execution writes every rank's input straight into every peer's output."""

    def __init__(self, comm: Comm, native: _native.AllGatherP, output: Buffer,
                 part: int) -> None:
        self._comm = comm
        self._n = native
        self._output: Optional[Buffer] = output
        self._part = part

    @classmethod
    def init(cls, comm: Comm, output: Buffer, hints: Hints,
             timeout: TimeoutLike) -> AllGatherPHandle:
        c = "all_gather_p_init"
        _check_hints(hints, c)
        t = positive_seconds(c, timeout)
        b = comm._buf(output, "output", c, writable=True)
        try:
            native = comm._n.all_gather_p_init(_raw(b, c), t)
        except FerrocommError as e:
            comm._failed(c, e)
            raise
        return cls(comm, native, output, b.count // comm.size)

    @staticmethod
    def of(handle: object) -> AllGatherPHandle:
        if not isinstance(handle, AllGatherPHandle):
            raise FerrocommValueError(
                f"all_gather_p: the handle must be what all_gather_p_init returned, not "
                f"{type(handle).__name__}")
        return handle

    def exec(self, comm: Comm, input: Buffer, async_op: bool, hints: Hints,  # noqa: A002
             timeout: TimeoutLike) -> Work:
        c = "all_gather_p_exec"
        if comm is not self._comm:
            raise FerrocommValueError(f"{c}: the handle belongs to another communicator")
        _check_hints(hints, c)
        if self._output is None:
            raise FerrocommValueError(f"{c}: the handle has been freed")
        raw = _raw(comm._buf(input, "input", c), c)
        t = positive_seconds(c, timeout)
        return _run(comm, c, lambda s, a, m: self._n.exec(raw, s, a, m, t), async_op, t,
                    (input, self._output))

    def free(self, comm: Comm) -> None:
        c = "all_gather_p_free"
        if comm is not self._comm:
            raise FerrocommValueError(f"{c}: the handle belongs to another communicator")
        try:
            self._n.free()
        except FerrocommError as e:
            comm._failed(c, e)
            raise
        self._output = None

    def __repr__(self) -> str:
        state = "freed" if self._output is None else f"{self._part} elements per rank"
        return f"AllGatherPHandle({state})"

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

import enum
import math

import numpy as np

from . import _native
from . import _tensors as T
from ._comm import (_CudaWork, _DONE, _HostWork, _MAX_COUNT, _alias, _bool_arg, _check_hints,
                    _int_arg, _rank_arg, _timeout_seconds)
from ._errors import FerrocommError, FerrocommValueError

__all__ = ["AllGatherPHandle", "TorchCommWinAccessType", "TorchCommWindowAttr", "Window",
           "shared_empty"]


class TorchCommWinAccessType(enum.Enum):
    """How a rank reaches a peer's window buffer (torchcomms' names)."""

    WIN_ACCESS_TYPE_UNIFIED = 0
    WIN_ACCESS_TYPE_SEPARATE = 1


class TorchCommWindowAttr:
    """What ``Window.get_attr(peer_rank)`` returns: ``access_type``."""

    __slots__ = ("access_type",)

    def __init__(self, access_type=TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED):
        self.access_type = access_type

    def __repr__(self):
        return f"TorchCommWindowAttr(access_type={self.access_type})"


class _Holder:
    """Raw memory as numpy sees it (``__array_interface__``), kept alive by the array made over
    it: it holds `owner`, the object whose life the memory's is."""

    def __init__(self, owner, ptr, nbytes):
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


class _CudaHolder:
    """Device memory as torch sees it (``__cuda_array_interface__``, bytes: it loses bf16 and
    fails on fp8, so the tensor made over it is viewed as the dtype afterwards)."""

    def __init__(self, owner, ptr, nbytes):
        self.owner = owner
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,),
                                         "typestr": "|u1", "version": 2}


def _is_torch_dtype(dtype):
    torch = T._torch()
    return torch is not None and isinstance(dtype, torch.dtype)


def shared_empty(shape, dtype):
    """Host memory a window on the host backend can register: a numpy array (``dtype`` a numpy
    dtype or its name) or a CPU torch tensor (``dtype`` a ``torch.dtype``) of ``shape``, zeroed,
    in shared memory the ranks of the communicator map (a segment of this process under
    /dev/shm, this user's only, while the array lives). CUDA windows need no such thing: any
    tensor from torch's default caching allocator registers."""
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if any(d < 0 for d in shape):
        raise FerrocommValueError(f"shared_empty: a negative dimension in shape {shape}")
    if _is_torch_dtype(dtype):
        itemsize = T._torch().empty(0, dtype=dtype).element_size()
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
        return T._torch().from_numpy(raw).view(dtype).reshape(shape)
    return raw.view(np.dtype(dtype)).reshape(shape)


def _run(comm, c, f, async_op, timeout, keep):
    """Runs native call `f(stream, native_async, mark)` of `comm` as its collectives run: on
    CUDA on the current stream (a completion marked after it for ``async_op``), on the host
    backend queued on the work thread for ``async_op``. Returns the work object; `keep` is what
    it holds until done, `timeout` what bounds its blocking wait."""
    comm._check_live(c)
    async_op = _bool_arg(c, "async_op", async_op)
    limit = _timeout_seconds(timeout)
    if limit is not None and not limit > 0:
        raise FerrocommValueError(f"{c}: timeout must be positive, got {timeout!r}")
    stream = 0
    if comm._cuda:
        torch = T._torch()
        if torch is None:
            raise FerrocommValueError(f"{c}: CUDA communicators need torch tensors")
        stream = T.current_stream_handle(torch, comm._n.device_index)
    try:
        native_work = f(stream, async_op and not comm._cuda, async_op and comm._cuda)
    except FerrocommError as e:
        comm._failed(c, e)
        raise
    if native_work is None:
        return _DONE
    if comm._cuda:
        return _CudaWork(native_work, comm._n.device_index, stream, keep, limit)
    return _HostWork(native_work, keep, (), limit)


class Window:
    """A window of a communicator (torchcomms' TorchCommWindow); ``comm.new_window()``."""

    def __init__(self, comm, native):
        self._comm = comm
        self._n = native
        # The registered tensor (None when registered with owning=False), and what describes
        # it: (dtype object, shape, device, numpy?).
        self._tensor = None
        self._meta = None

    # -- the registered buffer -------------------------------------------------------------

    @property
    def dtype(self):
        """The registered tensor's dtype (None before ``tensor_register``)."""
        return None if self._meta is None else self._meta[0]

    @property
    def shape(self):
        """The registered tensor's shape, as a list (None before ``tensor_register``)."""
        return None if self._meta is None else list(self._meta[1])

    @property
    def device(self):
        """The registered tensor's device (None before ``tensor_register``)."""
        return None if self._meta is None else self._meta[2]

    def get_buf_dtype(self):
        return self.dtype

    def get_buf_shape(self):
        return self.shape

    def get_buf_device(self):
        return self.device

    def get_size(self):
        """The registered tensor's size in bytes (0 before ``tensor_register``)."""
        return self._n.size_bytes

    def get_tensor(self):
        """The registered tensor, or None (none registered, or registered with
        ``owning=False``)."""
        return self._tensor

    def tensor_register(self, tensor, owning=True):
        """Registers ``tensor`` (contiguous, on the communicator's device): collective. Every
        rank registers a tensor of the same dtype and number of elements, and every peer maps
        it. On CUDA the memory must come from cudaMalloc (torch's default caching allocator),
        on the host backend from ``ferrocomm.shared_empty``. With ``owning=False`` the window
        does not keep the tensor alive: the caller must, until ``tensor_deregister``. Refused
        on every rank, nothing registered, when a rank's tensor does not qualify or the ranks'
        tensors differ."""
        c = "tensor_register"
        comm = self._comm
        comm._check_live(c)
        owning = _bool_arg(c, "owning", owning)
        b = comm._buf(tensor, "tensor", c, writable=True)
        name, _ = _alias(c, b, "sum")
        try:
            self._n.register((b.ptr, b.count, name, b.device))
        except FerrocommError as e:
            comm._failed(c, e)
            raise
        numpy = isinstance(tensor, np.ndarray)
        device = "cpu" if numpy else tensor.device
        self._meta = (tensor.dtype, tuple(tensor.shape), device, numpy)
        # The registered memory must outlive the registration: with owning=True the window
        # holds the tensor; the native side relies on it.
        self._tensor = tensor if owning else None

    def tensor_deregister(self):
        """Releases the registered tensor: collective. Every rank's window calls before it
        finish first (on CUDA the device is synchronized; not during graph capture); tensors
        from ``map_remote_tensor`` are invalid afterwards."""
        c = "tensor_deregister"
        self._comm._check_live(c)
        try:
            self._n.deregister()
        except FerrocommError as e:
            self._comm._failed(c, e)
            raise
        self._tensor = None
        self._meta = None

    # -- one-sided operations ----------------------------------------------------------------

    def put(self, tensor, dst_rank, target_offset_nelems, async_op=False, hints=None,
            timeout=None):
        """Writes ``tensor`` into rank ``dst_rank``'s registered tensor at element
        ``target_offset_nelems`` (its flat index), with no call on ``dst_rank``'s side.
        ``tensor`` has the window's dtype and must lie inside the target from that offset
        (refused, nothing written, otherwise). ``dst_rank`` may be this rank."""
        c = "put"
        _check_hints(hints, c)
        b = self._comm._buf(tensor, "tensor", c)
        name, _ = _alias(c, b, "sum")
        dst = _rank_arg(c, "dst_rank", dst_rank, self._comm.size)
        off = _int_arg(c, "target_offset_nelems", target_offset_nelems, 0, _MAX_COUNT)
        raw = (b.ptr, b.count, name, b.device)
        return _run(self._comm, c, lambda s, a, m: self._n.put(raw, dst, off, s, a, m), async_op,
                          timeout, (tensor,))

    def signal(self, peer_rank, async_op=False, hints=None, timeout=None):
        """Signals rank ``peer_rank`` after this rank's puts to it: its next
        ``wait_signal(this rank)`` returns, and those puts are visible to it then."""
        c = "signal"
        _check_hints(hints, c)
        peer = _rank_arg(c, "peer_rank", peer_rank, self._comm.size)
        return _run(self._comm, c, lambda s, a, m: self._n.signal(peer, s, a, m), async_op, timeout,
                          ())

    def wait_signal(self, peer_rank, async_op=False, hints=None, timeout=None):
        """Waits for the next signal from rank ``peer_rank`` (on CUDA the current stream waits;
        the host does not). ``timeout`` (else the communicator's) bounds the wait: one that
        runs out raises FerrocommTimeout naming the peer (on CUDA at the communicator's next
        call) and aborts the communicator; ``abort()`` ends a wait."""
        c = "wait_signal"
        _check_hints(hints, c)
        peer = _rank_arg(c, "peer_rank", peer_rank, self._comm.size)
        t = _timeout_seconds(timeout)
        return _run(self._comm, c, lambda s, a, m: self._n.wait_signal(peer, s, a, m, t), async_op,
                          timeout, ())

    def map_remote_tensor(self, rank):
        """Rank ``rank``'s registered tensor as mapped in this process (this rank's own: the
        registered memory), with the registered dtype and shape. Peers write into it at any
        time: read what a peer put after ``wait_signal`` for its signal. Invalid after
        ``tensor_deregister``."""
        c = "map_remote_tensor"
        self._comm._check_live(c)
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

    def get_attr(self, peer_rank):
        """How this rank reaches ``peer_rank``'s tensor: every peer's is mapped
        (``WIN_ACCESS_TYPE_UNIFIED``)."""
        c = "get_attr"
        self._comm._check_live(c)
        peer = _rank_arg(c, "peer_rank", peer_rank, self._comm.size)
        kind = self._n.access_type(peer)
        return TorchCommWindowAttr(TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED
                                   if kind == "unified"
                                   else TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE)

    def __repr__(self):
        if self._meta is None:
            return "Window(unregistered)"
        return f"Window({self.dtype}, shape={self.shape}, device={self.device})"


class AllGatherPHandle:
    """A persistent all-gather (what ``all_gather_p_init`` returns): the output is registered
    once and every execution writes every rank's input straight into every peer's output."""

    def __init__(self, comm, native, output, part):
        self._comm = comm
        self._n = native
        self._output = output
        self._part = part

    @classmethod
    def init(cls, comm, output, hints, timeout):
        c = "all_gather_p_init"
        comm._check_live(c)
        _check_hints(hints, c)
        t = _timeout_seconds(timeout)
        if t is not None and not t > 0:
            raise FerrocommValueError(f"{c}: timeout must be positive, got {timeout!r}")
        b = comm._buf(output, "output", c, writable=True)
        name, _ = _alias(c, b, "sum")
        try:
            native = comm._n.all_gather_p_init((b.ptr, b.count, name, b.device), t)
        except FerrocommError as e:
            comm._failed(c, e)
            raise
        return cls(comm, native, output, b.count // comm.size)

    @staticmethod
    def of(handle):
        if not isinstance(handle, AllGatherPHandle):
            raise FerrocommValueError(
                f"all_gather_p: the handle must be what all_gather_p_init returned, not "
                f"{type(handle).__name__}")
        return handle

    def exec(self, comm, input, async_op, hints):  # noqa: A002
        c = "all_gather_p_exec"
        if comm is not self._comm:
            raise FerrocommValueError(f"{c}: the handle belongs to another communicator")
        _check_hints(hints, c)
        if self._output is None:
            raise FerrocommValueError(f"{c}: the handle has been freed")
        b = comm._buf(input, "input", c)
        name, _ = _alias(c, b, "sum")
        raw = (b.ptr, b.count, name, b.device)
        t = comm._call_timeout
        return _run(comm, c, lambda s, a, m: self._n.exec(raw, s, a, m, t), async_op, t,
                    (input, self._output))

    def free(self, comm):
        c = "all_gather_p_free"
        if comm is not self._comm:
            raise FerrocommValueError(f"{c}: the handle belongs to another communicator")
        comm._check_live(c)
        try:
            self._n.free()
        except FerrocommError as e:
            comm._failed(c, e)
            raise
        self._output = None

    def __repr__(self):
        state = "freed" if self._output is None else f"{self._part} elements per rank"
        return f"AllGatherPHandle({state})"

"""The communicator object and its work objects (torchcomms' TorchComm and TorchWork)."""

from __future__ import annotations

import atexit
import datetime
import operator
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from . import _native
from . import _tensors as T
from ._errors import (FerrocommError, FerrocommPeerFailed, FerrocommTimeout, FerrocommUnsupported,
                      FerrocommValueError)
from ._ops import ReduceOp
from ._timeouts import TimeoutLike, positive_seconds, timeout_seconds
from ._work import DONE, CudaWork, HostWork, WithOutputs, Work

if TYPE_CHECKING:
    from ._window import AllGatherPHandle, Window
    from .hooks import PostHook, PreHook, RemovableHandle

# A numpy array or a torch tensor (torch is optional: its type is not named here).
Buffer = Any
# Per-call hints (`{"low_precision": "e4m3", "algo": "flat"}`); other backends' keys are ignored.
Hints = Optional[Mapping[str, object]]
# A reduction: a ReduceOp, a name ("sum"), or torch.distributed's ReduceOp.
OpLike = Any
# An all-to-all-v's (send counts, send displacements, recv counts, recv displacements).
SplitsList = list[list[int]]

_SUM = ReduceOp.SUM

__all__ = ["BatchSendRecv", "Comm", "CommOptions", "Work", "new_comm"]

_HINT_KEYS = ("low_precision", "algo")

# Element types with no native counterpart (NCCL has none either) travel as the bytes of a native
# type of the same width; none of them reduces except bool, which torch.distributed reduces over
# NCCL as uint8 with MAX for SUM (logical or) and MIN for PRODUCT (logical and). Low precision
# never applies to them.
_MOVE_AS = {
    "bool": "uint8",
    "int16": "float16",
    "uint16": "float16",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
}
_BOOL_OPS = {"sum": "max", "bor": "max", "max": "max", "prod": "min", "band": "min", "min": "min"}
_REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter")
# The fused call, and the names its FP8 option takes.
_NORM = "all_reduce_rmsnorm"
_QUANT = ("e4m3", "float8_e4m3fn", "fp8")


def _alias(coll: str, buf: T.Buf, opname: str) -> tuple[str, str]:
    """(dtype name to pass, op name to pass) for a buffer's element type (see _MOVE_AS)."""
    as_type = _MOVE_AS.get(buf.dtype)
    if as_type is None:
        if not T.native_dtype(buf.dtype):
            raise T.unsupported_dtype(buf.dtype, coll)
        return buf.dtype, opname
    if coll in _REDUCTIONS:
        if buf.dtype == "bool" and opname in _BOOL_OPS:
            return as_type, _BOOL_OPS[opname]
        if buf.dtype == "bool":
            raise FerrocommValueError(
                f"{coll}: op {opname} on bool is not supported (bool reduces with sum, product, "
                "min, max, band and bor only)"
            )
        raise FerrocommValueError(
            f"{coll}: {buf.dtype} cannot be reduced, only moved (all_gather, broadcast, "
            f"all_to_all, send/recv); reduce a wider type such as int32 or float32 instead"
        )
    return as_type, opname


# ---------------------------------------------------------------------------------------------
# Helpers


def _check_hints(hints: Hints, where: str) -> dict[str, str]:
    if hints is None:
        return {}
    if not isinstance(hints, dict):
        raise FerrocommValueError(f"{where}: hints must be a dict, not {type(hints).__name__}")
    out = {}
    for k, v in hints.items():
        if k in _HINT_KEYS:
            out[k] = str(v)
        # Unknown keys are other backends' hints (torchcomms passes them through), ignored.
    return out


def _device_arg(device: Any) -> Optional[str]:
    if device is None:
        return None
    if isinstance(device, int):
        return f"cuda:{device}"
    if isinstance(device, str):
        return device
    # torch.device
    t = getattr(device, "type", None)
    if t is not None:
        idx = getattr(device, "index", None)
        return t if idx is None else f"{t}:{idx}"
    raise FerrocommValueError(f"device must be a torch.device or a string, not {device!r}")


# ---------------------------------------------------------------------------------------------
# The communicator

# Communicators of this process: at exit each tells its peers' watchers that this rank leaves,
# so that the process's end is not taken for a failure where the peers still run.
_LIVE: weakref.WeakSet[Comm] = weakref.WeakSet()


@atexit.register
def _leave_all() -> None:
    for c in list(_LIVE):
        c._n.leave()


class Comm:
    """A group of ranks running collectives together (torchcomms' TorchComm).

    Collectives take numpy arrays or torch tensors (CPU tensors on the host backend, CUDA
    tensors on the cuda and nccl backends), contiguous, without copying them.
    """

    def __init__(self, native: _native.Comm, requested_backend: str,
                 hints: Optional[Mapping[str, str]] = None,
                 options: Optional[dict[str, Any]] = None) -> None:
        self._n = native
        self._requested = requested_backend
        self._hints = dict(hints or {})
        self._cuda = native.device_index != T.HOST
        # torchcomms parity: per-call timeouts, abort, options (see "-- torchcomms parity").
        self._options = options or {}
        _LIVE.add(self)

    # -- information ---------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._n.rank

    @property
    def size(self) -> int:
        return self._n.size

    def get_rank(self) -> int:
        return self._n.rank

    def get_size(self) -> int:
        return self._n.size

    def get_name(self) -> str:
        return self._n.name

    def get_backend(self) -> str:
        """The backend serving this communicator: ``host``, ``cuda`` or ``nccl``."""
        return self._n.backend

    def get_device(self) -> Any:
        """``torch.device`` when torch is available, else the device as a string."""
        name = T.device_name(self._n.device_index)
        torch = T._torch()
        return torch.device(name) if torch is not None else name

    def get_timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._n.timeout_s)

    def get_hints(self) -> dict[str, str]:
        return dict(self._hints)

    def set_hints(self, hints: Hints) -> None:
        self._hints = _check_hints(hints, "set_hints")

    def algo_for(self, collective: str, nbytes: int, dtype: Any, hints: Hints = None) -> str:
        """How a call would run: its plan as the bench prints it (``push``, ``flat``, ``flat-ce``,
        ``tree``, ``direct``, ``nccl``, ``lp-flat``, ...)."""
        h = {**self._hints, **_check_hints(hints, collective)}
        name = str(dtype).replace("torch.", "")
        if name in _MOVE_AS:
            name = _MOVE_AS[name]
            h["low_precision"] = "off"
        nbytes = _int_arg("algo_for", "nbytes", nbytes, 0, _MAX_COUNT)
        return self._n.algo_for(collective, nbytes, name, h.get("algo"), h.get("low_precision"))

    def __repr__(self) -> str:
        return (f"ferrocomm.Comm(name={self.get_name()!r}, rank={self.rank}, size={self.size}, "
                f"backend={self.get_backend()!r}, device={T.device_name(self._n.device_index)!r})")

    # -- lifecycle -------------------------------------------------------------------------

    def finalize(self) -> None:
        """Waits for queued work and releases the communicator; later calls raise. After
        ``abort()`` it returns at once (the abandoned work is not waited for)."""
        if not self._n.is_aborted:
            self._n.finalize()

    def __enter__(self) -> Comm:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.finalize()

    def split(self, ranks: Sequence[int], name: str, hints: Hints = None,
              timeout: TimeoutLike = None) -> Optional[Comm]:
        """A communicator of ``ranks`` (global ranks, new rank = position in the list), or None
        on ranks not listed. Listed ranks must all call it with the same list and name. It is
        created with this communicator's current timeout and then has ``timeout`` when given."""
        ranks = _int_list("split", "ranks", ranks, 0, self.size - 1)
        t = timeout_seconds(timeout)
        if t is not None and not t > 0:
            raise FerrocommValueError(f"split: timeout must be positive, got {timeout!r}")
        merged = {**self._hints, **_check_hints(hints, "split")}
        sub = self._n.split(ranks, str(name))
        if sub is None:
            return None
        c = Comm(sub, self._requested, merged, {**self._options, "name": str(name)})
        if t is not None:
            c.set_timeout(t)
        # A FlightRecorderHook registered here records the split's calls too (torchcomms').
        for fr in self.__dict__.get("_fr_hooks", ()):
            fr.register_with_comm(c)
        return c

    # -- plumbing --------------------------------------------------------------------------

    def _buf(self, obj: Buffer, what: str, coll: str, writable: bool = False) -> T.Buf:
        b = T.describe(obj, what, coll, writable)
        mine = self._n.device_index
        if b.device != mine:
            raise FerrocommValueError(
                f"{coll}: {what} is on {T.device_name(b.device)} but this communicator "
                f"({self.get_backend()} backend) is on {T.device_name(mine)}"
            )
        return b

    def _issue(self, coll: str, *, out: Optional[T.Buf] = None, inp: Optional[T.Buf] = None,
               op: OpLike = None, peer: int = 0, splits: Optional[SplitsList] = None,
               counts: Optional[tuple[Any, ...]] = None,
               batch: Optional[list[tuple[bool, T.Buf, int]]] = None,
               norm: Optional[tuple[Any, ...]] = None, async_op: bool = False,
               hints: Hints = None, timeout: TimeoutLike = None, keep: Sequence[Any] = (),
               post: Sequence[Callable[[], None]] = ()) -> Work:
        """Describes the call once, as the tuple the native layer reads into ferrocomm's
        CallDesc (crates/ferrocomm-py: PyCall), and runs it; returns its work object."""
        if async_op is not False and async_op is not True:
            async_op = _bool_arg(coll, "async_op", async_op)
        # The communicator's hints as they are unless the call brings its own (no copy per
        # call; a dict changed below is a new one).
        h = self._hints if hints is None else {**self._hints, **_check_hints(hints, coll)}
        opname, factor = ("sum", 1.0) if op is None or op is _SUM else \
            ReduceOp.coerce(op).native()
        cuda = self._cuda
        # The call's own timeout bounds each of its waits for a peer (native: on the host, in
        # the kernels, NCCL's watchdog; None: the communicator's) and the returned work's
        # blocking wait (None: the native bound, which follows the communicator's timeout).
        call_timeout = limit = positive_seconds(coll, timeout)
        stream = self._stream(coll) if cuda else 0
        raws: list[Optional[_native.RawBuf]] = [None, None]
        for k, b in enumerate((out, inp)):
            if b is None:
                continue
            name, opname = _alias(coll, b, opname)
            if name != b.dtype:
                h = {**h, "low_precision": "off"}
            raws[k] = (b.ptr, b.count, name, b.device)
        native_batch: Optional[list[tuple[bool, _native.RawBuf, int]]] = None
        if batch is not None:
            native_batch = []
            for is_send, b, p in batch:
                name, opname = _alias(coll, b, opname)
                native_batch.append((is_send, (b.ptr, b.count, name, b.device), p))
        call = (coll, raws[0], raws[1], (opname, factor), int(peer),
                (stream, h.get("algo"), h.get("low_precision"), call_timeout),
                splits, counts, native_batch, norm)
        # Only host calls are queued; a CUDA async call's completion is recorded by the native
        # call itself unless list outputs are copied out after it (then after the copies, below).
        mark = cuda and bool(async_op) and not post
        try:
            native_work = self._n.run(call, bool(async_op) and not cuda, mark)
        except FerrocommError as e:
            self._failed(coll, e)
            raise
        if isinstance(native_work, _native.Completion):
            return CudaWork(native_work, self._n.device_index, stream, keep, limit, self._n)
        if native_work is not None:
            # Queued on the work thread: only async calls return before they finish.
            return HostWork(native_work, keep, post, limit)
        # Issued (CUDA: enqueued on the current stream; host: finished). Copies of list
        # variants go on the same stream, after the collective.
        for f in post:
            f()
        done = self._n.mark(stream, coll) if cuda and async_op else None
        if done is not None:
            return CudaWork(done, self._n.device_index, stream, keep, limit, self._n)
        return DONE

    def _stream(self, coll: str) -> int:
        """The current CUDA stream of the communicator's device, where a call of ``coll``
        enqueues (a CUDA communicator's)."""
        torch = T._torch()
        if torch is None:
            raise FerrocommValueError(f"{coll}: CUDA communicators need torch tensors")
        return T.current_stream_handle(torch, self._n.device_index)

    def _in_place_or(self, out: T.Buf, inp: T.Buf, offset_elems: int) -> Optional[T.Buf]:
        """None (in place) when `inp` is `out` shifted by `offset_elems` elements (NCCL's in-place
        convention), `inp` when disjoint; overlapping any other way is an error."""
        if inp.device == out.device and inp.ptr == out.ptr + offset_elems * out.esize \
                and inp.dtype == out.dtype:
            return None
        if inp.overlaps(out):
            raise FerrocommValueError(
                "input and output overlap (only the in-place layout of the collective is allowed)"
            )
        return inp

    # -- collectives -----------------------------------------------------------------------

    def all_reduce(self, tensor: Buffer, op: OpLike = ReduceOp.SUM, async_op: bool = False,
                   hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """Reduces ``tensor`` over all ranks, in place."""
        c = "all_reduce"
        b = self._buf(tensor, "tensor", c, writable=True)
        return self._issue(c, timeout=timeout,
                           out=b, op=op, async_op=async_op, hints=hints, keep=(tensor,))

    allreduce = all_reduce

    def all_reduce_rmsnorm(self, x: Buffer, residual: Buffer, weight: Buffer, eps: float, *,
                           out: Optional[Buffer] = None, residual_out: Optional[Buffer] = None,
                           quant: Optional[str] = None, scale: Any = None,
                           async_op: bool = False, hints: Hints = None,
                           timeout: TimeoutLike = None) -> Any:
        """All-reduce of ``x`` over all ranks, residual add and RMSNorm of every row, in one
        call. For ``x`` and ``residual`` of shape ``(..., hidden)`` and ``weight`` of
        ``(hidden,)``::

            r = all_reduce(x) + residual                       -> residual_out (default: residual)
            y = r / sqrt(mean(r ** 2, last dim) + eps) * weight -> out (default: x)

        with f32 accumulation, bit-identical on every rank. Returns ``(out, residual_out)``;
        ``quant="e4m3"`` also returns ``y`` as FP8 E4M3 codes with one f32 scale per row (shape
        ``(..., 1)``, ``y ~= codes * scale``): ``(out, residual_out, codes, scales)``. With
        ``scale=s`` as well (one f32 scale for the whole tensor, as FP8 GEMMs with static
        activation scales take it: a one-element float32 tensor on x's device, read when the call
        runs so that a CUDA graph replay sees its current value, or a number) the codes are
        ``e4m3(y / s)`` saturated at +-448, and ``scales`` is ``s`` as a one-element tensor. With
        ``async_op=True``, a work object whose ``result()`` gives them."""
        c = _NORM
        xb = self._buf(x, "x", c, writable=out is None)
        rb = self._buf(residual, "residual", c, writable=residual_out is None)
        wb = self._buf(weight, "weight", c)
        shape = tuple(xb.shape)
        if len(shape) == 0:
            raise FerrocommValueError(f"{c}: x must have a last (hidden) dimension, not a scalar")
        if tuple(wb.shape) != (shape[-1],):
            raise FerrocommValueError(
                f"{c}: weight has shape {tuple(wb.shape)}, expected ({shape[-1]},) (x's hidden "
                "size)")
        if tuple(rb.shape) != shape:
            raise FerrocommValueError(f"{c}: residual has shape {tuple(rb.shape)}, x has {shape}")
        for name, b in (("residual", rb), ("weight", wb)):
            if b.dtype != xb.dtype:
                raise FerrocommValueError(f"{c}: {name} is {b.dtype}, x is {xb.dtype}")
        ob = rob = None
        for name, obj in (("out", out), ("residual_out", residual_out)):
            if obj is None:
                continue
            b = self._buf(obj, name, c, writable=True)
            if tuple(b.shape) != shape or b.dtype != xb.dtype:
                raise FerrocommValueError(
                    f"{c}: {name} is {b.dtype} of shape {tuple(b.shape)}, expected x's "
                    f"{xb.dtype} of shape {shape}")
            if name == "out":
                ob = b
            else:
                rob = b
        if quant is not None and str(quant).lower() not in _QUANT:
            raise FerrocommValueError(f"{c}: quant must be None or 'e4m3', not {quant!r}")
        if scale is not None and quant is None:
            raise FerrocommValueError(f"{c}: scale= is the FP8 rows' given scale: pass quant='e4m3'")
        try:
            eps = float(eps)
        except (TypeError, ValueError):
            raise FerrocommValueError(f"{c}: eps must be a number, not {eps!r}") from None

        outputs: tuple[Any, ...] = (out if out is not None else x,
                                    residual_out if residual_out is not None else residual)
        fp8 = None
        if quant is not None:
            codes, scales = T.fp8_rows_like(xb.obj, shape)
            given = scale is not None
            if given:
                scales = T.given_scale_like(xb.obj, scale, c)
            outputs += (codes, scales)
            cb = self._buf(codes, "codes", c, writable=True)
            sb = self._buf(scales, "scale" if given else "scales", c, writable=not given)
            if given and (sb.dtype != "float32" or sb.count != 1):
                raise FerrocommValueError(
                    f"{c}: scale must hold one float32 value, not {sb.count} of {sb.dtype}")
            # numpy has no FP8 type: the codes travel as the E4M3 bytes they are.
            fp8 = ((cb.ptr, cb.count, "f8e4m3", cb.device), sb.raw(), given)
        # In place unless separate outputs are given: the written buffer and, apart, the input.
        written, res_written = ob or xb, rob or rb
        norm = (rb.raw() if rob is not None else None, res_written.raw(), wb.raw(), eps, fp8)
        keep = (x, residual, weight, out, residual_out) + outputs
        work = self._issue(c, out=written, inp=xb if ob is not None else None, norm=norm,
                           async_op=async_op, hints=hints, timeout=timeout, keep=keep)
        if async_op:
            return WithOutputs(work, outputs)
        return outputs

    def reduce(self, tensor: Buffer, root: int, op: OpLike = ReduceOp.SUM, async_op: bool = False,
               hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """Reduces ``tensor`` over all ranks into ``tensor`` on ``root`` (others unchanged)."""
        return self._one_buffer("reduce", tensor, "root", root, op=op, async_op=async_op,
                                hints=hints, timeout=timeout)

    def broadcast(self, tensor: Buffer, root: int, async_op: bool = False, hints: Hints = None,
                  timeout: TimeoutLike = None) -> Work:
        """Copies ``root``'s ``tensor`` into ``tensor`` on every rank."""
        return self._one_buffer("broadcast", tensor, "root", root, async_op=async_op,
                                hints=hints, timeout=timeout)

    def all_gather_single(self, output: Buffer, input: Buffer,  # noqa: A002
                          async_op: bool = False, hints: Hints = None,
                          timeout: TimeoutLike = None) -> Work:
        """``output`` (size x input elements) receives every rank's ``input`` in rank order."""
        c = "all_gather_single"
        o = self._buf(output, "output", c, writable=True)
        i = self._buf(input, "input", c)
        inp = self._in_place_or(o, i, self.rank * i.count)
        return self._issue("all_gather", timeout=timeout, out=o, inp=inp, async_op=async_op,
                           hints=hints, keep=(output, input))

    def all_gather(self, tensor_list: Sequence[Buffer], tensor: Buffer, async_op: bool = False,
                   hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """``tensor_list[r]`` receives rank r's ``tensor``."""
        c = "all_gather"
        i = self._buf(tensor, "tensor", c)
        self._check_list(c, "tensor_list", tensor_list, i)
        staging = T.empty_like_flat(i, i.count * self.size)
        o = self._buf(staging, "output", c, writable=True)
        n = i.count

        def post() -> None:
            for r, t in enumerate(tensor_list):
                T.copy_into(t, T.flat_slice(staging, r * n, n))

        return self._issue("all_gather", timeout=timeout,
                           out=o, inp=i, async_op=async_op, hints=hints,
                           keep=(tensor, staging, tensor_list), post=(post,))

    def reduce_scatter_single(self, output: Buffer, input: Buffer,  # noqa: A002
                              op: OpLike = ReduceOp.SUM, async_op: bool = False,
                              hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """``output`` receives part ``rank`` of the reduction of every rank's ``input``."""
        c = "reduce_scatter_single"
        o = self._buf(output, "output", c, writable=True)
        i = self._buf(input, "input", c)
        if self._in_place_or(o, i, -self.rank * o.count) is None:
            # In place: the native call writes part `rank` of the whole input buffer.
            whole = T.Buf(input, i.ptr, i.count, i.dtype, i.device, i.esize)
            return self._issue("reduce_scatter", timeout=timeout,
                               out=whole, op=op, async_op=async_op,
                               hints=hints, keep=(output, input))
        return self._issue("reduce_scatter", timeout=timeout,
                           out=o, inp=i, op=op, async_op=async_op,
                           hints=hints, keep=(output, input))

    def reduce_scatter(self, output: Buffer, input_list: Sequence[Buffer],
                       op: OpLike = ReduceOp.SUM, async_op: bool = False, hints: Hints = None,
                       timeout: TimeoutLike = None) -> Work:
        """``output`` receives the reduction over ranks of every rank's ``input_list[rank]``."""
        c = "reduce_scatter"
        o = self._buf(output, "output", c, writable=True)
        self._check_list(c, "input_list", input_list, o)
        staging = T.concat_flat(list(input_list), output)
        i = self._buf(staging, "input", c)
        return self._issue("reduce_scatter", timeout=timeout,
                           out=o, inp=i, op=op, async_op=async_op,
                           hints=hints, keep=(output, staging))

    def all_to_all_single(self, output: Buffer, input: Buffer,  # noqa: A002
                          async_op: bool = False, hints: Hints = None,
                          timeout: TimeoutLike = None, *,
                          output_split_sizes: Optional[Sequence[int]] = None,
                          input_split_sizes: Optional[Sequence[int]] = None) -> Work:
        """Part j of ``input`` goes to rank j; part i of ``output`` comes from rank i, in equal
        parts (torchcomms' form). ``output_split_sizes`` / ``input_split_sizes`` (keywords,
        rows of dim 0 as in torch) make the parts uneven, as ``all_to_all_v_single`` does."""
        c = "all_to_all_single"
        if not isinstance(async_op, (bool, np.bool_)):
            raise FerrocommValueError(
                f"{c}: async_op must be a bool, not {type(async_op).__name__} ({async_op!r}); "
                "split sizes go to all_to_all_v_single(output, input, output_split_sizes, "
                "input_split_sizes, async_op), torchcomms' order, or to the keywords "
                "output_split_sizes= and input_split_sizes=")
        if output_split_sizes is not None or input_split_sizes is not None:
            return self._all_to_all_split(c, output, input, output_split_sizes,
                                          input_split_sizes, async_op, hints, timeout)
        o = self._buf(output, "output", c, writable=True)
        i = self._buf(input, "input", c)
        inp = self._in_place_or(o, i, 0)
        return self._issue("all_to_all", timeout=timeout,
                           out=o, inp=inp, async_op=async_op, hints=hints, keep=(output, input))

    def all_to_all_v_single(self, output: Buffer, input: Buffer,  # noqa: A002
                            output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                            async_op: bool = False, hints: Hints = None,
                            timeout: TimeoutLike = None) -> Work:
        """``input_split_sizes[j]`` rows of ``input`` (dim 0, as in torch; back to back) go to
        rank j; ``output_split_sizes[i]`` rows from rank i land in ``output`` in rank order."""
        return self._all_to_all_split("all_to_all_v_single", output, input, output_split_sizes,
                                      input_split_sizes, async_op, hints, timeout)

    def _all_to_all_split(self, c: str, output: Buffer, input: Buffer,  # noqa: A002
                          output_split_sizes: Optional[Sequence[int]],
                          input_split_sizes: Optional[Sequence[int]], async_op: bool,
                          hints: Hints, timeout: TimeoutLike) -> Work:
        """An all-to-all-v by split sizes (None on one side: equal parts there)."""
        o = self._buf(output, "output", c, writable=True)
        i = self._buf(input, "input", c)
        send = self._split_counts(c, "input", input, input_split_sizes)
        recv = self._split_counts(c, "output", output, output_split_sizes)
        splits = _packed(send, recv)
        inp = self._in_place_or(o, i, 0)
        if inp is None and send != recv:
            raise FerrocommValueError(f"{c}: in place needs equal input and output split sizes")
        return self._issue("all_to_all_v", timeout=timeout,
                           out=o, inp=inp, splits=splits, async_op=async_op,
                           hints=hints, keep=(output, input))

    def all_to_all_v_dynamic(self, output: Buffer, input: Buffer,  # noqa: A002
                             send_counts: Buffer, recv_counts: Buffer, async_op: bool = False,
                             hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """Mixture-of-experts dispatch with the counts on the device: no host synchronization,
        capturable in CUDA graphs. Counts count rows (the first dimension), as torch's split
        sizes do.

        ``input`` holds the rows for rank 0, 1, ... back to back, ``send_counts[p]`` rows for
        rank p (``size`` int32 or int64 entries, which an earlier kernel on the stream may have
        written). ``output`` holds ``size * capacity`` rows of the input's row shape: the rows
        from rank s land at row ``s * capacity``, ``recv_counts[s]`` (same dtype, written by the
        call) says how many arrived, rows past them are left as they were. A negative count
        sends nothing. More rows than the capacity, or counts past the end of the input, are
        cut and reported as an error (on CUDA by the next call on this communicator), never
        written past a buffer. Every rank passes the same capacity, row shape and dtypes.
        """
        c = "all_to_all_v_dynamic"
        o = self._buf(output, "output", c, writable=True)
        i = self._buf(input, "input", c)
        sc = self._buf(send_counts, "send_counts", c)
        rc = self._buf(recv_counts, "recv_counts", c, writable=True)
        row = self._dynamic_rows(c, o, i, output, input, (("send_counts", sc),
                                                          ("recv_counts", rc)))
        out_rows, _ = T.rows_of(output, c)
        if out_rows % self.size != 0:
            raise FerrocommValueError(
                f"{c}: output has {out_rows} rows, not a capacity per rank for {self.size} ranks "
                "(size * capacity rows)")
        counts = (sc.raw(), rc.raw(), out_rows // self.size, row)
        return self._issue(c, timeout=timeout,
                           out=o, inp=i, counts=counts, async_op=async_op, hints=hints,
                           keep=(output, input, send_counts, recv_counts))

    def device_alltoallv_single(self, output: Buffer, input: Buffer,  # noqa: A002
                                output_split_sizes: Buffer, input_split_sizes: Buffer,
                                async_op: bool = False, hints: Hints = None,
                                timeout: TimeoutLike = None) -> Work:
        """All-to-all-v with both sides' split sizes in tensors (NCCLX's name and layout): on
        CUDA they may come from earlier kernels on the stream, never read by the host, so the
        call is capturable in CUDA graphs. Split sizes count rows (the first dimension).

        ``input_split_sizes[p]`` rows of ``input`` (back to back) go to rank p;
        ``output_split_sizes[s]`` rows from rank s land in ``output`` at the sum of the sizes
        before it (``size`` int32 or int64 entries each; a negative size is 0). On CUDA, sizes
        that disagree between ranks, or that run past ``input`` or ``output``, are reported by
        the next call on every rank (what fits is moved, nothing is written past a buffer); on
        the host backend the sizes are read at once and checked as ``all_to_all_single``'s.
        """
        c = "device_alltoallv_single"
        o = self._buf(output, "output", c, writable=True)
        i = self._buf(input, "input", c)
        sc = self._buf(input_split_sizes, "input_split_sizes", c)
        rc = self._buf(output_split_sizes, "output_split_sizes", c)
        row = self._dynamic_rows(c, o, i, output, input, (("input_split_sizes", sc),
                                                          ("output_split_sizes", rc)))
        counts = (sc.raw(), rc.raw(), 0, row)
        return self._issue("all_to_all_v_dynamic_packed", timeout=timeout,
                           out=o, inp=i, counts=counts,
                           async_op=async_op, hints=hints,
                           keep=(output, input, input_split_sizes, output_split_sizes))

    def _dynamic_rows(self, c: str, o: T.Buf, i: T.Buf, output: Buffer,
                      input: Buffer,  # noqa: A002
                      counts: tuple[tuple[str, T.Buf], tuple[str, T.Buf]]) -> int:
        """Elements per row of the device-count calls' data; refuses overlaps and row shapes
        that differ."""
        if i.overlaps(o):
            raise FerrocommValueError(f"{c}: input and output overlap (it has no in-place form)")
        _, out_row = T.rows_of(output, c)
        _, in_row = T.rows_of(input, c)
        if out_row != in_row:
            raise FerrocommValueError(
                f"{c}: output rows hold {out_row} elements but input rows {in_row} (shapes "
                f"{tuple(o.shape)} and {tuple(i.shape)})")
        for what, b in counts:
            for other in (o, i):
                if b.overlaps(other):
                    raise FerrocommValueError(f"{c}: {what} overlaps the data")
        if counts[0][1].overlaps(counts[1][1]):
            raise FerrocommValueError(f"{c}: {counts[0][0]} and {counts[1][0]} overlap")
        return max(out_row, 1)

    def all_to_all(self, output_tensor_list: Sequence[Buffer],
                   input_tensor_list: Sequence[Buffer], async_op: bool = False,
                   hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """``input_tensor_list[j]`` goes to rank j; ``output_tensor_list[i]`` comes from rank i."""
        c = "all_to_all"
        for what, lst in (("output_tensor_list", output_tensor_list),
                          ("input_tensor_list", input_tensor_list)):
            if len(lst) != self.size:
                raise FerrocommValueError(
                    f"{c}: {what} has {len(lst)} entries, expected one per rank ({self.size})")
        ins = [self._buf(t, f"input_tensor_list[{k}]", c) for k, t in enumerate(input_tensor_list)]
        first = ins[0]
        for k, t in enumerate(output_tensor_list):
            _check_like(c, "output_tensor_list", k, t, first, self)
        for k, b in enumerate(ins):
            if b.dtype != first.dtype:
                raise FerrocommValueError(
                    f"{c}: dtype mismatch: input_tensor_list[{k}] is {b.dtype}, "
                    f"expected {first.dtype}")
        send = [b.count for b in ins]
        recv = [_numel(t) for t in output_tensor_list]
        staging_in = T.concat_flat(list(input_tensor_list), input_tensor_list[0])
        staging_out = T.empty_like_flat(first, sum(recv))
        i = self._buf(staging_in, "input", c)
        o = self._buf(staging_out, "output", c, writable=True)
        offs = _prefix(recv)

        def post() -> None:
            for r, t in enumerate(output_tensor_list):
                T.copy_into(t, T.flat_slice(staging_out, offs[r], recv[r]))

        keep = (staging_in, staging_out, output_tensor_list)
        if len(set(send)) == 1 and send == recv:
            return self._issue("all_to_all", timeout=timeout,
                               out=o, inp=i, async_op=async_op, hints=hints,
                               keep=keep, post=(post,))
        return self._issue("all_to_all_v", timeout=timeout,
                           out=o, inp=i, splits=_packed(send, recv),
                           async_op=async_op, hints=hints, keep=keep, post=(post,))

    # -- torchcomms' uneven and rooted list methods, built on the all-to-all-v -----------------
    # Each is one all-to-all-v (parts of zero elements where nothing moves), so it runs where
    # the all-to-all-v runs: direct access on one node, NCCL elsewhere, the host backend.

    def all_gather_v(self, tensor_list: Sequence[Buffer], tensor: Buffer, async_op: bool = False,
                     hints: Hints = None, timeout: TimeoutLike = None) -> Work:
        """``tensor_list[r]`` receives rank r's ``tensor``; the sizes may differ between ranks
        (``tensor_list[r]`` has rank r's size)."""
        c = "all_gather_v"
        i = self._buf(tensor, "tensor", c)
        outs = self._list_like(c, "tensor_list", tensor_list, i)
        n = i.count
        # Every peer's part is the same input: the send parts overlap, which reading allows.
        splits = [[n] * self.size, [0] * self.size, outs, _prefix(outs)]
        return self._gathered(c, tensor_list, i, tensor, splits, async_op, hints, timeout)

    def gather(self, output_tensor_list: Optional[Sequence[Buffer]], input_tensor: Buffer,
               root: int, async_op: bool = False, hints: Hints = None,
               timeout: TimeoutLike = None) -> Work:
        """On ``root``, ``output_tensor_list[r]`` receives rank r's ``input_tensor``; other
        ranks pass any list (it is not touched) or None."""
        c = "gather"
        root = self._root(c, root)
        i = self._buf(input_tensor, "input_tensor", c)
        send = [0] * self.size
        send[root] = i.count
        if self.rank == root:
            outs = self._list_like(c, "output_tensor_list", output_tensor_list, i)
        else:
            outs = [0] * self.size
        splits = [send, [0] * self.size, outs, _prefix(outs)]
        lst = output_tensor_list if self.rank == root and output_tensor_list is not None else []
        return self._gathered(c, lst, i, input_tensor, splits, async_op, hints, timeout)

    def scatter(self, output_tensor: Buffer, input_tensor_list: Optional[Sequence[Buffer]],
                root: int, async_op: bool = False, hints: Hints = None,
                timeout: TimeoutLike = None) -> Work:
        """``output_tensor`` receives ``input_tensor_list[rank]`` of ``root``; other ranks pass
        any list (it is not read) or None."""
        c = "scatter"
        root = self._root(c, root)
        o = self._buf(output_tensor, "output_tensor", c, writable=True)
        if self.rank == root:
            sizes = self._list_like(c, "input_tensor_list", input_tensor_list, o)
            staging = T.concat_flat(list(input_tensor_list or ()), output_tensor)
        else:
            sizes = [0] * self.size
            staging = T.empty_like_flat(o, 0)
        i = self._buf(staging, "input", c)
        recv = [0] * self.size
        recv[root] = o.count
        splits = [sizes, _prefix(sizes), recv, [0] * self.size]
        return self._issue("all_to_all_v", timeout=timeout,
                           out=o, inp=i, splits=splits, async_op=async_op,
                           hints=hints, keep=(output_tensor, staging))

    def reduce_scatter_v(self, output: Buffer, input_list: Sequence[Buffer],
                         op: OpLike = ReduceOp.SUM, async_op: bool = False, hints: Hints = None,
                         timeout: TimeoutLike = None) -> Work:
        """``output`` receives the reduction over ranks of every rank's ``input_list[rank]``;
        the parts may differ in size (``input_list[r]`` has rank r's output size on every
        rank). Runs as a reduce-scatter of parts padded to the largest."""
        c = "reduce_scatter_v"
        o = self._buf(output, "output", c, writable=True)
        sizes = self._list_like(c, "input_list", input_list, o)
        if sizes[self.rank] != o.count:
            raise FerrocommValueError(
                f"{c}: input_list[{self.rank}] has {sizes[self.rank]} elements but the output "
                f"{o.count}")
        width = max(sizes)
        # Zeros in the padding: it is reduced too (and thrown away), and in low precision it
        # shares scale blocks with the data, so it must be finite and small.
        padded = T.zeros_like_flat(o, width * self.size)
        for r, t in enumerate(input_list):
            T.copy_flat_into(padded, r * width, t)
        part = T.empty_like_flat(o, width)
        i = self._buf(padded, "input", c)
        po = self._buf(part, "output", c, writable=True)

        def post() -> None:
            T.copy_into(output, T.flat_slice(part, 0, o.count))

        return self._issue("reduce_scatter", timeout=timeout,
                           out=po, inp=i, op=op, async_op=async_op,
                           hints=hints, keep=(output, padded, part), post=(post,))

    def _root(self, coll: str, root: object) -> int:
        return _rank_arg(coll, "root", root, self.size)

    def _list_like(self, coll: str, what: str, lst: Optional[Sequence[Buffer]],
                   like: T.Buf) -> list[int]:
        """The element counts of a list of one buffer per rank, each of `like`'s dtype and
        device (sizes may differ)."""
        if lst is None or len(lst) != self.size:
            got = "None" if lst is None else f"{len(lst)} entries"
            raise FerrocommValueError(
                f"{coll}: {what} has {got}, expected one per rank ({self.size})")
        for k, t in enumerate(lst):
            _check_like(coll, what, k, t, like, self)
        return [_numel(t) for t in lst]

    def _gathered(self, coll: str, out_list: Sequence[Buffer], i: T.Buf,
                  input: Buffer,  # noqa: A002
                  splits: SplitsList, async_op: bool, hints: Hints,
                  timeout: TimeoutLike) -> Work:
        """One all-to-all-v of `i` by `splits` into a staging buffer, copied into `out_list`
        (by the receive counts) when it is done."""
        recv, displs = splits[2], splits[3]
        staging = T.empty_like_flat(i, sum(recv))
        o = self._buf(staging, "output", coll, writable=True)

        def post() -> None:
            for r, t in enumerate(out_list):
                T.copy_into(t, T.flat_slice(staging, displs[r], recv[r]))

        return self._issue("all_to_all_v", timeout=timeout,
                           out=o, inp=i, splits=splits, async_op=async_op,
                           hints=hints, keep=(input, staging, out_list), post=(post,))

    def barrier(self, async_op: bool = False, hints: Hints = None,
                timeout: TimeoutLike = None) -> Work:
        """Returns (or its work completes) once every rank has called it."""
        return self._issue("barrier", timeout=timeout, async_op=async_op, hints=hints)

    # -- one-sided communication (ferrocomm._window) ------------------------------------------

    def new_window(self, tensor: Optional[Buffer] = None) -> Window:
        """A window for one-sided communication (torchcomms' TorchCommWindow); with ``tensor``
        it is registered at once (collective, see ``Window.tensor_register``)."""
        from ._window import Window

        try:
            w = Window(self, self._n.new_window())
        except FerrocommError as e:
            self._failed("new_window", e)
            raise
        if tensor is not None:
            w.tensor_register(tensor)
        return w

    def all_gather_p_init(self, output: Buffer, hints: Hints = None,
                          timeout: TimeoutLike = None) -> AllGatherPHandle:
        """A persistent all-gather into ``output`` (registered once: peers write straight into
        it; collective): returns the handle ``all_gather_p_exec`` and ``all_gather_p_free``
        take."""
        from ._window import AllGatherPHandle

        return AllGatherPHandle.init(self, output, hints, timeout)

    def all_gather_p_exec(self, handle: AllGatherPHandle, input: Buffer,  # noqa: A002
                          async_op: bool = False, hints: Hints = None,
                          timeout: TimeoutLike = None) -> Work:
        """Gathers every rank's ``input`` into every rank's registered output, part r from
        rank r (collective); ``input`` may be this rank's part of the output."""
        from ._window import AllGatherPHandle

        return AllGatherPHandle.of(handle).exec(self, input, async_op, hints, timeout)

    def all_gather_p_free(self, handle: AllGatherPHandle) -> None:
        """Releases a persistent all-gather's output (collective)."""
        from ._window import AllGatherPHandle

        AllGatherPHandle.of(handle).free(self)

    def batch_op_create(self) -> BatchSendRecv:
        """A batch of sends and receives issued together (torchcomms' BatchSendRecv)."""
        return BatchSendRecv(self)

    def _batch(self, ops: list[tuple[bool, Buffer, object]], async_op: bool, hints: Hints,
               timeout: TimeoutLike) -> Work:
        c = "batch_send_recv"
        batch = []
        for k, (is_send, t, p) in enumerate(ops):
            what = f"{'send' if is_send else 'recv'} #{k}"
            b = self._buf(t, what, c, writable=not is_send)
            peer = _rank_arg(f"{c} {what}", "dst" if is_send else "src", p, self.size)
            batch.append((is_send, b, peer))
        return self._issue(c, timeout=timeout, batch=batch, async_op=async_op, hints=hints,
                           keep=tuple(t for _, t, _ in ops))

    def send(self, tensor: Buffer, dst: int, async_op: bool = False, hints: Hints = None,
             timeout: TimeoutLike = None) -> Work:
        """Sends ``tensor`` to rank ``dst``, which calls ``recv`` with the same size."""
        return self._one_buffer("send", tensor, "dst", dst, async_op=async_op, hints=hints,
                                timeout=timeout)

    def recv(self, tensor: Buffer, src: int, async_op: bool = False, hints: Hints = None,
             timeout: TimeoutLike = None) -> Work:
        """Receives into ``tensor`` from rank ``src``."""
        return self._one_buffer("recv", tensor, "src", src, async_op=async_op, hints=hints,
                                timeout=timeout)

    def _one_buffer(self, c: str, tensor: Buffer, what: str, peer: int, op: OpLike = None,
                    async_op: bool = False, hints: Hints = None,
                    timeout: TimeoutLike = None) -> Work:
        """A call on one buffer and one other rank (`what`: root, dst or src): the send reads
        ``tensor``, the reduce, broadcast and receive write it."""
        b = self._buf(tensor, "tensor", c, writable=c != "send")
        peer = _rank_arg(c, what, peer, self.size)
        inp, out = (b, None) if c == "send" else (None, b)
        return self._issue(c, timeout=timeout, out=out, inp=inp, op=op, peer=peer,
                           async_op=async_op, hints=hints, keep=(tensor,))

    # -- argument checks -------------------------------------------------------------------

    def _check_list(self, coll: str, what: str, lst: Sequence[Buffer], like: T.Buf) -> None:
        if len(lst) != self.size:
            raise FerrocommValueError(
                f"{coll}: {what} has {len(lst)} entries, expected one per rank ({self.size})")
        for k, t in enumerate(lst):
            _check_like(coll, what, k, t, like, self)
            n = _numel(t)
            if n != like.count:
                raise FerrocommValueError(
                    f"{coll}: {what}[{k}] has {n} elements, expected {like.count}")

    def _split_counts(self, coll: str, what: str, obj: Buffer,
                      sizes: Optional[Sequence[int]]) -> list[int]:
        """Elements per part from ``sizes`` (rows); wrong sizes refuse the call for the peers
        too (they fail it at once instead of waiting for this rank)."""
        try:
            return self._split_counts_checked(coll, what, obj, sizes)
        except FerrocommValueError as e:
            self._n.refuse(coll, str(e))
            raise

    def _split_counts_checked(self, coll: str, what: str, obj: Buffer,
                              sizes: Optional[Sequence[int]]) -> list[int]:
        rows, per_row = T.rows_of(obj, coll)
        if sizes is None:
            if rows % self.size != 0:
                raise FerrocommValueError(
                    f"{coll}: {what} has {rows} rows, which do not split into {self.size} "
                    "equal parts")
            return [rows // self.size * per_row] * self.size
        sizes = _int_list(coll, f"{what}_split_sizes", sizes, 0, _MAX_COUNT)
        if len(sizes) != self.size:
            raise FerrocommValueError(
                f"{coll}: {what}_split_sizes has {len(sizes)} entries, expected {self.size}")
        if any(s < 0 for s in sizes) or sum(sizes) != rows:
            raise FerrocommValueError(
                f"{coll}: {what}_split_sizes {sizes} do not add up to its {rows} rows")
        return [s * per_row for s in sizes]


    # -- torchcomms parity: failures, abort, timeouts, options, gather_single --------------

    def _failed(self, coll: str, e: FerrocommError) -> None:
        """A call failed natively: a timeout aborts the communicator (torchcomms' rule: a peer
        is missing, later calls must not wait for it again); with
        abort_process_on_timeout_or_error a timeout or a failure of the communication ends the
        process here. Argument errors (FerrocommValueError, FerrocommUnsupported) only raise,
        wherever they are found."""
        if isinstance(e, (FerrocommValueError, FerrocommUnsupported)):
            return
        if isinstance(e, (FerrocommTimeout, FerrocommPeerFailed)):
            if not self._n.is_aborted:
                self._n.abort(f"{coll} timed out" if isinstance(e, FerrocommTimeout) else
                              f"{coll}: rank {self._n.failed_peer()} failed or exited")
            # Where the flight recorder's dumps are, in the message itself.
            if e.args and "flight recorder" not in str(e.args[0]):
                e.args = (f"{e.args[0]} (flight recorder dumps: {self._n.trace_dir}; analyze "
                          f"with `ferrocomm trace {self._n.trace_dir}`)",) + e.args[1:]
        self._on_error(e)

    def _on_error(self, e: FerrocommError) -> None:
        if self._options.get("abort_process_on_timeout_or_error"):
            print(f"ferrocomm: aborting the process: {e}", file=sys.stderr, flush=True)
            # The abort hooks run (once) and the flight recorder is dumped first.
            self._n.abort()
            os.abort()

    # -- hooks and the flight recorder (ferrocomm.hooks) --------------------------------------

    def register_pre_hook(self, callback: PreHook) -> RemovableHandle:
        """``callback(name: OpName, op_id: int, args)`` before every call; returns a handle
        whose ``remove()`` unregisters it (see ferrocomm.hooks)."""
        from . import hooks
        return hooks.register(self, "pre", callback)

    def register_post_hook(self, callback: PostHook) -> RemovableHandle:
        """``callback(op_id: int, args)`` after every call (``args.work``: its work)."""
        from . import hooks
        return hooks.register(self, "post", callback)

    def register_abort_hook(self, callback: Callable[[], object]) -> RemovableHandle:
        """``callback()`` once when the communicator is aborted: abort(), a timeout, or a
        peer that died or gave up (then on the watcher's thread)."""
        from . import hooks
        if not callable(callback):
            raise TypeError(f"register_abort_hook: the hook must be callable, not {callback!r}")
        return hooks.RemovableHandle(self._n.register_abort_hook(callback).remove)

    def dump_flight_recorder(self, path: Optional[str | os.PathLike[str]] = None) -> str:
        """Dumps the flight recorder of this process's communicators (torch's format) to
        ``path``, or to ``ferrocomm_trace_rank_<rank>`` in ``get_trace_dir()``; returns the
        file's path."""
        return self._n.dump_flight_recorder(None if path is None else os.fspath(path))

    def get_trace_dir(self) -> str:
        """Where the flight recorder's dumps go (``FERROCOMM_TRACE_DIR``, else a per-job
        directory under the temporary directory)."""
        return self._n.trace_dir

    def abort(self) -> None:
        """Gives up on the communicator (torchcomms' abort): the abort hooks run, every later
        call raises at once; the peers' watchers learn it within milliseconds and fail their
        communicators naming this rank (FerrocommPeerFailed: their host waits and
        direct-access kernels end, NCCL is aborted), an NCCL communicator underneath is
        aborted (its kernels exit), the flight recorder is dumped. Queued work is not waited
        for; the memory is released when the communicator object is."""
        self._n.abort()

    def is_aborted(self) -> bool:
        return self._n.is_aborted or self._n.failed_peer() is not None

    def is_abort_supported(self) -> bool:
        """True: every backend of ferrocomm's serves ``abort()``."""
        return True

    def set_timeout(self, timeout: TimeoutLike) -> None:
        """The timeout of every later call (a timedelta or seconds), longer or shorter than
        the one the communicator was created with: each wait for a peer uses it, and it bounds
        the blocking wait of the works those calls return."""
        t = timeout_seconds(timeout)
        if t is None or not t > 0:
            raise FerrocommValueError(f"set_timeout: timeout must be positive, got {timeout!r}")
        self._n.set_timeout(t)

    def get_options(self) -> CommOptions:
        o = self._options
        return CommOptions(bool(o.get("abort_process_on_timeout_or_error")), self.get_timeout(),
                           o.get("store"), self.get_name(), self.get_hints())

    def get_backend_version(self) -> str:
        """ferrocomm's version (the library serving every backend)."""
        return _native.__version__

    def gather_single(self, output: Optional[Buffer], input: Buffer,  # noqa: A002
                      root: int, async_op: bool = False, hints: Hints = None,
                      timeout: TimeoutLike = None) -> Work:
        """On ``root``, ``output`` (size x input elements) receives every rank's ``input`` in
        rank order; other ranks' ``output`` is not touched (any buffer or None)."""
        c = "gather_single"
        root = self._root(c, root)
        i = self._buf(input, "input", c)
        n = i.count
        send = [0] * self.size
        send[root] = n
        if self.rank == root:
            o = self._buf(output, "output", c, writable=True)
            if o.count != n * self.size:
                raise FerrocommValueError(
                    f"{c}: output has {o.count} elements, expected {self.size} x {n}")
            if o.dtype != i.dtype:
                raise FerrocommValueError(
                    f"{c}: dtype mismatch: output is {o.dtype}, input {i.dtype}")
            recv = [n] * self.size
            if self._in_place_or(o, i, self.rank * n) is None:
                # In place (input is this rank's part of output): send a copy.
                i = self._buf(T.concat_flat([input], input), "input", c)
            keep: tuple[Any, ...] = (output, input, i.obj)
        else:
            recv = [0] * self.size
            o = self._buf(T.empty_like_flat(i, 0), "output", c, writable=True)
            keep = (input, o.obj)
        splits = [send, [0] * self.size, recv, _prefix(recv)]
        return self._issue("all_to_all_v", timeout=timeout,
                           out=o, inp=i, splits=splits, async_op=async_op,
                           hints=hints, keep=keep)


# ---------------------------------------------------------------------------------------------
# Options and batches

class CommOptions:
    """What ``Comm.get_options()`` returns (torchcomms' CommOptions)."""

    __slots__ = ("abort_process_on_timeout_or_error", "timeout", "store", "name", "hints")

    def __init__(self, abort_process_on_timeout_or_error: bool, timeout: datetime.timedelta,
                 store: Any, name: str, hints: dict[str, str]) -> None:
        self.abort_process_on_timeout_or_error = abort_process_on_timeout_or_error
        self.timeout = timeout
        self.store = store
        self.name = name
        self.hints = hints

    def __repr__(self) -> str:
        return (f"CommOptions(name={self.name!r}, timeout={self.timeout!r}, "
                f"abort_process_on_timeout_or_error={self.abort_process_on_timeout_or_error}, "
                f"hints={self.hints!r})")




class BatchSendRecv:
    """Sends and receives issued together, as NCCL's group (torchcomms' BatchSendRecv): add them
    with ``send`` and ``recv``, then ``issue()``. They progress at once, so a rank may send to
    a peer and receive from it in one batch in either order; between two ranks, messages match
    in the order issued. ``issue`` returns a work object like any collective."""

    def __init__(self, comm: Comm) -> None:
        self._comm = comm
        self._ops: list[tuple[bool, Buffer, object]] = []

    def send(self, tensor: Buffer, dst: int) -> None:
        self._ops.append((True, tensor, dst))

    def recv(self, tensor: Buffer, src: int) -> None:
        self._ops.append((False, tensor, src))

    def issue(self, async_op: bool = False, options: object = None, *, hints: Hints = None,
              timeout: TimeoutLike = None) -> Work:
        del options  # torchcomms' batch options; none applies here
        return self._comm._batch(list(self._ops), async_op, hints, timeout)


# Largest count or size a Python argument may give (what the native layer's u64/i64 hold).
_MAX_COUNT = 2**63 - 1


def _int_arg(coll: str, name: str, value: object, lo: int, hi: int, what: str = "an int",
             span: Optional[str] = None) -> int:
    """An integer argument in ``lo..=hi``: Python, numpy and torch integers are accepted; bool,
    float, str, None and anything else are refused with FerrocommValueError, not rounded or
    left to the native layer's TypeError or OverflowError."""
    dtype = getattr(value, "dtype", None)
    if isinstance(value, bool) or dtype is not None and \
            str(dtype).replace("torch.", "") == "bool":
        raise FerrocommValueError(f"{coll}: {name} must be {what}, not a bool ({value!r})")
    try:
        v = operator.index(value)  # type: ignore[arg-type]  # anything may come in
    except TypeError:
        raise FerrocommValueError(
            f"{coll}: {name} must be {what}, not {type(value).__name__} ({value!r})"
        ) from None
    if not lo <= v <= hi:
        raise FerrocommValueError(f"{coll}: {name} {v} is out of range {span or f'({lo}..{hi})'}")
    return v


def _int_list(coll: str, name: str, values: object, lo: int, hi: int) -> list[int]:
    """A list of integer arguments (split sizes, ranks), each checked as `_int_arg`."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise FerrocommValueError(
            f"{coll}: {name} must be a list of ints, not {type(values).__name__} ({values!r})")
    if not isinstance(values, Iterable):
        raise FerrocommValueError(f"{coll}: {name} must be a list of ints, not {values!r}")
    return [_int_arg(coll, f"{name}[{k}]", v, lo, hi) for k, v in enumerate(values)]


def _bool_arg(coll: str, name: str, value: object) -> bool:
    """A flag argument: bool or numpy bool; anything else is refused, not taken for its truth."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise FerrocommValueError(f"{coll}: {name} must be a bool, not {type(value).__name__} "
                              f"({value!r})")


def _rank_arg(coll: str, name: str, value: object, size: int) -> int:
    """A rank argument (``root``, ``dst``, ``src``) as an int in ``0..size``."""
    return _int_arg(coll, name, value, 0, size - 1, "an int rank",
                    f"for {size} ranks (0..{size - 1})")


def _numel(t: Buffer) -> int:
    n: int = t.size if hasattr(t, "flags") else t.numel()
    return n


def _check_like(coll: str, what: str, k: int, t: Buffer, like: T.Buf, comm: Comm) -> None:
    """List entries must be buffers of the same dtype and device as `like`."""
    if not T.is_buffer(t):
        raise FerrocommValueError(
            f"{coll}: {what}[{k}] must be a numpy array or a torch tensor, not {type(t).__name__}")
    dtype = t.dtype.name if hasattr(t, "flags") else str(t.dtype).replace("torch.", "")
    if dtype != like.dtype:
        raise FerrocommValueError(
            f"{coll}: dtype mismatch: {what}[{k}] is {dtype}, expected {like.dtype}")
    if hasattr(t, "flags"):
        dev = T.HOST
    else:
        dev = T.HOST if t.device.type == "cpu" else (t.device.index or 0)
    if dev != comm._n.device_index:
        raise FerrocommValueError(
            f"{coll}: {what}[{k}] is on {T.device_name(dev)} but this communicator is on "
            f"{T.device_name(comm._n.device_index)}")


def _prefix(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for n in counts:
        out.append(acc)
        acc += n
    return out


def _packed(send: Sequence[int], recv: Sequence[int]) -> SplitsList:
    return [list(send), _prefix(send), list(recv), _prefix(recv)]


def _torch_distributed_store(rank: Optional[int],
                             size: Optional[int]) -> tuple[Any, Optional[int], Optional[int]]:
    """(store, rank, size) to meet through when torch.distributed is initialized: a prefix of
    its default store (the job's one store: a second on MASTER_PORT would find the port taken
    where no torchrun agent moved it), and its rank and size where not given."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, rank, size
    from torch.distributed import distributed_c10d as c10d
    store = dist.PrefixStore("ferrocomm/", c10d._get_default_store())
    return (store, dist.get_rank() if rank is None else rank,
            dist.get_world_size() if size is None else size)


def new_comm(backend: str, device: Any, name: Optional[str] = None,
             abort_process_on_timeout_or_error: Optional[bool] = None,
             timeout: TimeoutLike = None, is_high_priority_stream: object = None,
             store: Any = None, enable_reconfigure: bool = False, hints: Hints = None, *,
             rank: Optional[int] = None, size: Optional[int] = None,
             local_rank: Optional[int] = None, local_size: Optional[int] = None,
             high_priority_stream: object = None) -> Comm:
    """Creates a communicator; every rank of the group calls it with the same arguments.

    The arguments are torchcomms' (positional order and keywords). ``backend``:
    ``"ferrocomm"`` (cuda for a CUDA device, host for ``"cpu"``), ``"cuda"``, ``"host"`` or
    ``"nccl"``. ``device``: ``torch.device`` or a string (``"cuda"`` is LOCAL_RANK's GPU,
    ``"cuda:1"``, ``"cpu"``). ``name``: the same on every rank (required). Rank and size come
    from ``rank``/``size`` or torchrun's RANK/WORLD_SIZE; peers meet through ``store``
    (anything with torch Store's ``set``/``get``/``wait``/``add``/``check``/``delete_key``) or
    the TCP store at MASTER_ADDR/MASTER_PORT. ``timeout`` (timedelta or seconds) bounds every
    wait. ``hints`` sets defaults for every call (``{"low_precision": "e4m3", "algo":
    "flat"}``). ``abort_process_on_timeout_or_error=True`` aborts the process when a call
    fails or times out (default: it raises). ``is_high_priority_stream`` is accepted and
    ignored (calls run on the caller's stream; ``high_priority_stream`` is its former name).
    ``enable_reconfigure=True`` (torchcomms' fault tolerance) is refused: ferrocomm has no
    ``reconfigure``.
    """
    del is_high_priority_stream, high_priority_stream
    if name is None or str(name) == "":
        raise FerrocommValueError("new_comm: name is required (the same on every rank)")
    if enable_reconfigure:
        raise FerrocommUnsupported(
            "new_comm: enable_reconfigure=True needs reconfigure(), which ferrocomm does not "
            "have (docs/python.md lists what torchcomms has that ferrocomm lacks)")
    # The native layer bounds them further (a size of at most 65536 ranks, a rank below it).
    rank, size, local_rank, local_size = (
        None if v is None else _int_arg("new_comm", k, v, lo, _MAX_COUNT)
        for k, v, lo in (("rank", rank, 0), ("size", size, 1), ("local_rank", local_rank, 0),
                         ("local_size", local_size, 1)))
    if store is None:
        store, rank, size = _torch_distributed_store(rank, size)
    native = _native.new_comm(
        str(name),
        str(backend),
        _device_arg(device),
        rank=rank,
        size=size,
        local_rank=local_rank,
        local_size=local_size,
        timeout_s=timeout_seconds(timeout),
        store=store,
    )
    options = {"abort_process_on_timeout_or_error": bool(abort_process_on_timeout_or_error),
               "store": store, "name": str(name)}
    return Comm(native, str(backend), _check_hints(hints, "new_comm"), options)

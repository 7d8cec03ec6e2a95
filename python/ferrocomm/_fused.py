"""The fused all-reduce + residual add + RMSNorm (+ FP8 rows): ``Comm.all_reduce_rmsnorm`` and
the module-level ``ferrocomm.all_reduce_rmsnorm`` that takes the group as an argument.

For ``x`` and ``residual`` of shape ``(..., hidden)`` and ``weight`` of ``(hidden,)``::

    r = all_reduce(x) + residual                               -> residual_out (default: residual)
    y = r / sqrt(mean(r ** 2, last dim) + eps) * weight        -> out (default: x)

with f32 accumulation, bit-identical on every rank; ``quant="e4m3"`` also returns ``y`` as FP8
E4M3 codes with one f32 scale per row (shape ``(..., 1)``, ``y ~= codes * scale``), or with
``scale=s`` (one f32 scale for the whole tensor, as FP8 GEMMs with static activation scales take
it: a one-element float32 tensor on x's device, read when the call runs so that a CUDA graph
replay sees its current value, or a number) codes ``e4m3(y / s)`` saturated at +-448, returned
with ``s`` as a one-element tensor.
"""

import sys

import numpy as np

from . import _tensors as T
from ._comm import Comm, Work, _check_hints
from ._errors import FerrocommError, FerrocommValueError

__all__ = ["all_reduce_rmsnorm"]

_C = "all_reduce_rmsnorm"
_QUANT = ("e4m3", "float8_e4m3fn", "fp8")


class _WithOutputs(Work):
    """An ``async_op=True`` call: ``wait()`` as the call's work, ``result()`` the outputs."""

    def __init__(self, work, outputs):
        self._work = work
        self._outputs = outputs

    def wait(self, *args):
        return self._work.wait(*args)

    def wait_blocking(self):
        self._work.wait_blocking()

    def is_completed(self):
        return self._work.is_completed()

    def result(self):
        """The outputs, as the call with ``async_op=False`` returns them (valid after wait)."""
        return self._outputs

    def __repr__(self):
        return repr(self._work)


def _fp8_outputs(xb, shape):
    """New (codes, scales) buffers for rows of `shape` on x's device, and their raw forms."""
    rows_shape = tuple(shape[:-1]) + (1,)
    obj = xb.obj
    if isinstance(obj, np.ndarray):
        codes = np.empty(shape, dtype=np.uint8)
        scales = np.empty(rows_shape, dtype=np.float32)
        craw = (codes.__array_interface__["data"][0], codes.size, "f8e4m3", T.HOST)
        sraw = (scales.__array_interface__["data"][0], scales.size, "float32", T.HOST)
        return codes, scales, (craw, sraw)
    torch = T._torch()
    codes = torch.empty(shape, dtype=torch.float8_e4m3fn, device=obj.device)
    scales = torch.empty(rows_shape, dtype=torch.float32, device=obj.device)
    return codes, scales, (
        (codes.data_ptr(), codes.numel(), "float8_e4m3fn", xb.device),
        (scales.data_ptr(), scales.numel(), "float32", xb.device),
    )


def _given_scale(comm, xb, scale):
    """The one-element float32 buffer of a given FP8 scale on x's device (made from a number),
    and its raw form."""
    obj = xb.obj
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) or hasattr(scale, "dtype")):
        raise FerrocommValueError(
            f"{_C}: scale must be a number or a one-element float32 tensor, not "
            f"{type(scale).__name__}"
        )
    if isinstance(scale, (int, float)):
        if isinstance(obj, np.ndarray):
            scale = np.array([scale], dtype=np.float32)
        else:
            torch = T._torch()
            scale = torch.tensor([float(scale)], dtype=torch.float32, device=obj.device)
    sb = comm._buf(scale, "scale", _C)
    if sb.dtype != "float32" or sb.count != 1:
        raise FerrocommValueError(
            f"{_C}: scale must hold one float32 value, not {sb.count} of {sb.dtype}"
        )
    return scale, sb


def run(comm, x, residual, weight, eps, out=None, residual_out=None, quant=None, scale=None,
        async_op=False, hints=None):
    """``Comm.all_reduce_rmsnorm`` (see the module doc); returns ``(out, residual_out)``, with
    ``quant`` ``(out, residual_out, codes, scales)`` (``scales`` the given scale with
    ``scale=``); with ``async_op=True`` a work object whose ``result()`` gives them."""
    comm._check_live(_C)
    xb = comm._buf(x, "x", _C, writable=out is None)
    rb = comm._buf(residual, "residual", _C, writable=residual_out is None)
    wb = comm._buf(weight, "weight", _C)
    shape = tuple(xb.shape)
    if len(shape) == 0:
        raise FerrocommValueError(f"{_C}: x must have a last (hidden) dimension, not a scalar")
    if tuple(wb.shape) != (shape[-1],):
        raise FerrocommValueError(
            f"{_C}: weight has shape {tuple(wb.shape)}, expected ({shape[-1]},) (x's hidden size)"
        )
    if tuple(rb.shape) != shape:
        raise FerrocommValueError(f"{_C}: residual has shape {tuple(rb.shape)}, x has {shape}")
    for b in (rb, wb):
        if b.dtype != xb.dtype:
            name = "residual" if b is rb else "weight"
            raise FerrocommValueError(f"{_C}: {name} is {b.dtype}, x is {xb.dtype}")
    ob = rob = None
    for name, obj in (("out", out), ("residual_out", residual_out)):
        if obj is None:
            continue
        b = comm._buf(obj, name, _C, writable=True)
        if tuple(b.shape) != shape or b.dtype != xb.dtype:
            raise FerrocommValueError(
                f"{_C}: {name} is {b.dtype} of shape {tuple(b.shape)}, expected x's {xb.dtype} "
                f"of shape {shape}"
            )
        if name == "out":
            ob = b
        else:
            rob = b
    if quant is not None and str(quant).lower() not in _QUANT:
        raise FerrocommValueError(f"{_C}: quant must be None or 'e4m3', not {quant!r}")
    if scale is not None and quant is None:
        raise FerrocommValueError(f"{_C}: scale= is the FP8 rows' given scale: pass quant='e4m3'")
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise FerrocommValueError(f"{_C}: eps must be a number, not {eps!r}") from None

    h = {**comm._hints, **_check_hints(hints, _C)}
    cuda = comm._n.device_index != T.HOST
    stream = 0
    torch = None
    if cuda:
        torch = T._torch()
        if torch is None:
            raise FerrocommValueError(f"{_C}: CUDA communicators need torch tensors")
        stream = T.current_stream_handle(torch, comm._n.device_index)
    outputs = (out if out is not None else x, residual_out if residual_out is not None else residual)
    fp8 = None
    given = scale is not None
    if quant is not None:
        codes, scales, fp8 = _fp8_outputs(xb, shape)
        if given:
            scales, sb = _given_scale(comm, xb, scale)
            fp8 = (fp8[0], sb.raw())
        outputs += (codes, scales)
    try:
        native = comm._n.all_reduce_rmsnorm(
            xb.raw(), rb.raw(), wb.raw(), eps,
            ob.raw() if ob is not None else None,
            rob.raw() if rob is not None else None,
            fp8, stream, h.get("algo"), h.get("low_precision"), bool(async_op) and not cuda,
            fp8_given=given,
        )
    except FerrocommError as e:
        comm._failed(_C, e)
        raise
    keep = (x, residual, weight, out, residual_out) + outputs
    if native is not None:
        from ._comm import _HostWork

        return _WithOutputs(_HostWork(native, keep, ()), outputs)
    if async_op:
        from ._comm import _CudaWork, _DoneWork

        if cuda:
            done = comm._n.mark(stream, _C)
            return _WithOutputs(_CudaWork(done, comm._n.device_index, stream, keep), outputs)
        return _WithOutputs(_DoneWork(), outputs)
    return outputs


def all_reduce_rmsnorm(x, residual, weight, eps, *, group=None, out=None, residual_out=None,
                       quant=None, scale=None, async_op=False, hints=None):
    """The fused call as a function of its group (torch.distributed has no such call): ``group``
    is a ``ferrocomm.Comm`` (from ``ferrocomm.new_comm``), or a torch.distributed process group
    of the ``"ferrocomm"`` backend (``None``: the default group); see
    ``Comm.all_reduce_rmsnorm``."""
    return run(_comm_of(group, x), x, residual, weight, eps, out=out, residual_out=residual_out,
               quant=quant, scale=scale, async_op=async_op, hints=hints)


def _comm_of(group, x):
    """The communicator a group runs ``x`` on."""
    if isinstance(group, Comm):
        return group
    # The torch backend is loaded whenever a "ferrocomm" process group exists.
    fct = sys.modules.get("ferrocomm.torch")
    if fct is not None:
        if group is None:
            import torch.distributed as dist

            group = dist.group.WORLD if dist.is_initialized() else None
        if isinstance(group, fct.ProcessGroupFerrocomm):
            return group.comm_for(x)
    raise FerrocommValueError(
        f"{_C}: group must be a ferrocomm communicator (ferrocomm.new_comm) or a process group of "
        f"the \"ferrocomm\" torch.distributed backend, not {type(group).__name__}"
    )

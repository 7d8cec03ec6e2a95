"""The fused all-reduce + residual add + RMSNorm (+ FP8 rows): ``Comm.all_reduce_rmsnorm`` and
the module-level ``ferrocomm.all_reduce_rmsnorm`` that takes the group as an argument.

For ``x`` and ``residual`` of shape ``(..., hidden)`` and ``weight`` of ``(hidden,)``::

    r = all_reduce(x) + residual                               -> residual_out (default: residual)
    y = r / sqrt(mean(r ** 2, last dim) + eps) * weight        -> out (default: x)

with f32 accumulation, bit-identical on every rank; ``quant="e4m3"`` also returns ``y`` as FP8
E4M3 codes with one f32 scale per row (shape ``(..., 1)``, ``y ~= codes * scale``).
"""

import sys

import numpy as np

from . import _tensors as T
from ._comm import Comm, Work
from ._errors import FerrocommValueError

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
    """New (codes, scales) buffers for rows of `shape` on x's device."""
    rows_shape = tuple(shape[:-1]) + (1,)
    obj = xb.obj
    if isinstance(obj, np.ndarray):
        return np.empty(shape, dtype=np.uint8), np.empty(rows_shape, dtype=np.float32)
    torch = T._torch()
    return (torch.empty(shape, dtype=torch.float8_e4m3fn, device=obj.device),
            torch.empty(rows_shape, dtype=torch.float32, device=obj.device))


def run(comm, x, residual, weight, eps, out=None, residual_out=None, quant=None,
        async_op=False, hints=None):
    """``Comm.all_reduce_rmsnorm`` (see the module doc); returns ``(out, residual_out)``, with
    ``quant`` ``(out, residual_out, codes, scales)``; with ``async_op=True`` a work object whose
    ``result()`` gives them."""
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
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise FerrocommValueError(f"{_C}: eps must be a number, not {eps!r}") from None

    outputs = (out if out is not None else x, residual_out if residual_out is not None else residual)
    fp8 = None
    if quant is not None:
        codes, scales = _fp8_outputs(xb, shape)
        outputs += (codes, scales)
        cb = comm._buf(codes, "codes", _C, writable=True)
        sb = comm._buf(scales, "scales", _C, writable=True)
        # numpy has no FP8 type: the codes travel as the E4M3 bytes they are.
        fp8 = ((cb.ptr, cb.count, "f8e4m3", cb.device), sb.raw())
    # In place unless separate outputs are given: the written buffer and, apart, the input.
    written, res_written = ob or xb, rob or rb
    norm = (rb.raw() if rob is not None else None, res_written.raw(), wb.raw(), eps, fp8)
    keep = (x, residual, weight, out, residual_out) + outputs
    work = comm._issue(_C, out=written, inp=xb if ob is not None else None, norm=norm,
                       async_op=async_op, hints=hints, keep=keep)
    if async_op:
        return _WithOutputs(work, outputs)
    return outputs


def all_reduce_rmsnorm(x, residual, weight, eps, *, group=None, out=None, residual_out=None,
                       quant=None, async_op=False, hints=None):
    """The fused call as a function of its group (torch.distributed has no such call): ``group``
    is a ``ferrocomm.Comm`` (from ``ferrocomm.new_comm``), or a torch.distributed process group
    of the ``"ferrocomm"`` backend (``None``: the default group); see
    ``Comm.all_reduce_rmsnorm``."""
    return run(_comm_of(group, x), x, residual, weight, eps, out=out, residual_out=residual_out,
               quant=quant, async_op=async_op, hints=hints)


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

"""The fused all-reduce + residual add + RMSNorm (+ FP8 rows) as a function of its group:
``ferrocomm.all_reduce_rmsnorm(x, residual, weight, eps, group=...)``, for torch.distributed
code that holds a process group rather than a communicator (``Comm.all_reduce_rmsnorm`` is the
call itself)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from ._comm import Buffer, Comm, Hints
from ._errors import FerrocommValueError
from ._timeouts import TimeoutLike

__all__ = ["all_reduce_rmsnorm"]

_C = "all_reduce_rmsnorm"


def all_reduce_rmsnorm(x: Buffer, residual: Buffer, weight: Buffer, eps: float, *,
                       group: Any = None, out: Optional[Buffer] = None,
                       residual_out: Optional[Buffer] = None, quant: Optional[str] = None,
                       scale: Any = None, async_op: bool = False, hints: Hints = None,
                       timeout: TimeoutLike = None) -> Any:
    """The fused call as a function of its group (torch.distributed has no such call): ``group``
    is a ``ferrocomm.Comm`` (from ``ferrocomm.new_comm``), or a torch.distributed process group
    of the ``"ferrocomm"`` backend (``None``: the default group); see
    ``Comm.all_reduce_rmsnorm``."""
    return _comm_of(group, x).all_reduce_rmsnorm(
        x, residual, weight, eps, out=out, residual_out=residual_out, quant=quant, scale=scale,
        async_op=async_op, hints=hints, timeout=timeout)


def _comm_of(group: Any, x: Buffer) -> Comm:
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
            comm: Comm = group.comm_for(x)
            return comm
    raise FerrocommValueError(
        f"{_C}: group must be a ferrocomm communicator (ferrocomm.new_comm) or a process group of "
        f"the \"ferrocomm\" torch.distributed backend, not {type(group).__name__}"
    )

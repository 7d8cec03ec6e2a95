"""ferrocomm: GPU collectives (direct data access over NVLink, FP8 low precision, NCCL
underneath) and a shared-memory host backend, behind a torchcomms-style API.

    import ferrocomm
    with ferrocomm.new_comm("ferrocomm", "cuda", "tp") as comm:
        comm.all_reduce(t, ferrocomm.ReduceOp.SUM, async_op=False)

torch is optional: numpy arrays and CPU tensors work on the host backend, CUDA tensors on the
cuda and nccl backends.
"""

from ._comm import BatchSendRecv, Comm, CommOptions, Work, new_comm
from ._fused import all_reduce_rmsnorm
from . import _errors, hooks
from ._errors import (
    FerrocommError,
    FerrocommPeerFailed,
    PeerFailed,
    FerrocommTimeout,
    FerrocommUnsupported,
    FerrocommValueError,
)
from ._native import __version__
from ._ops import ReduceOp
from ._window import (
    AllGatherPHandle,
    TorchCommWinAccessType,
    TorchCommWindowAttr,
    Window,
    shared_empty,
)

TorchComm = Comm
TorchWork = Work
TorchCommWindow = Window

__all__ = [
    "new_comm",
    "all_reduce_rmsnorm",
    "BatchSendRecv",
    "Comm",
    "CommOptions",
    "TorchComm",
    "Work",
    "TorchWork",
    "ReduceOp",
    "Window",
    "TorchCommWindow",
    "TorchCommWindowAttr",
    "TorchCommWinAccessType",
    "AllGatherPHandle",
    "shared_empty",
]
__all__ += _errors.__all__
__all__ += ["hooks", "__version__"]

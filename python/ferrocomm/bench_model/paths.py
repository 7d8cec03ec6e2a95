"""Communication paths: how the model's all-reduces (and add + norm after them) are done.

| path | all-reduce |
|---|---|
| `nccl` | `torch.distributed` on an NCCL group |
| `gloo` | `torch.distributed` on gloo through CPU copies (the reference where NCCL cannot run) |
| `ferrocomm` | `Comm.all_reduce`, full precision |
| `ferrocomm-lp` | `Comm.all_reduce` with the per-call hint `low_precision` (e4m3 unless told) |
| `ferrocomm-fused` | `Comm.all_reduce_rmsnorm` (all-reduce, residual add and RMSNorm in one call) |
| `ferrocomm-fused-lp` | the same with the `low_precision` hint |
| `none` | nothing: the step without communication, for the communication share |

Every path also gathers the logits of the vocabulary-split output head (`all_gather`): gloo's
and NCCL's through torch.distributed, ferrocomm's `all_gather_single` in full precision.
"""

import torch

from .config import BenchArgumentError
from .model import rmsnorm

PATHS = ("nccl", "gloo", "ferrocomm", "ferrocomm-lp", "ferrocomm-fused", "ferrocomm-fused-lp",
         "none")
LP_FORMATS = ("e4m3", "e5m2", "int8")
ALGOS = ("auto", "push", "flat", "tree")


class Reducer:
    """A path's all-reduce; `add_norm` is all-reduce, residual add and the next RMSNorm."""

    name = "none"
    graphable = True

    def all_reduce(self, x):
        """In place. The base class communicates nothing (the `none` path, one rank)."""

    def all_gather(self, out, x):
        """`out` [world, *x.shape] receives every rank's `x` in rank order. The base class
        copies its own `x` into every part (the same work as receiving them)."""
        out.copy_(x.expand_as(out))

    def add_norm(self, x, residual, weight, eps):
        """(normed, new residual) after all-reducing the partial sum `x`."""
        self.all_reduce(x)
        r = residual + x
        return rmsnorm(r, weight, eps), r


class TorchDist(Reducer):
    """torch.distributed on `group`; through CPU copies when `via_cpu` (gloo and CUDA tensors)."""

    def __init__(self, name, group, via_cpu):
        import torch.distributed as dist

        self.name, self._group, self._via_cpu = name, group, via_cpu
        self._dist = dist
        self.graphable = not via_cpu and name == "nccl"

    def all_reduce(self, x):
        if self._via_cpu and x.is_cuda:
            c = x.cpu()
            self._dist.all_reduce(c, group=self._group)
            x.copy_(c)
        else:
            self._dist.all_reduce(x, group=self._group)

    def all_gather(self, out, x):
        if self._via_cpu:
            parts = [torch.empty_like(x, device="cpu") for _ in range(out.shape[0])]
            self._dist.all_gather(parts, x.cpu(), group=self._group)
            out.copy_(torch.stack(parts))
        else:
            self._dist.all_gather_into_tensor(out, x, group=self._group)


class Ferro(Reducer):
    """ferrocomm's `Comm.all_reduce` with per-call hints.

    `lp` is a wire format or None; messages below `lp_min_bytes` stay full precision. `algo`
    forces one all-reduce algorithm (flat: one-shot, tree: two-shot, push: one-shot push)."""

    def __init__(self, name, comm, lp=None, algo="auto", lp_min_bytes=0):
        self.name, self._comm = name, comm
        self._lp, self._lp_min = lp, lp_min_bytes
        self._base = {} if algo == "auto" else {"algo": algo}
        self._off = {**self._base, "low_precision": "off"}
        self._on = {**self._base, "low_precision": lp} if lp else self._off

    def hints(self, x):
        if self._lp and x.numel() * x.element_size() >= self._lp_min:
            return self._on
        return self._off

    def all_reduce(self, x):
        self._comm.all_reduce(x, "sum", hints=self.hints(x))

    def all_gather(self, out, x):
        # The logits travel exactly: low precision is for the all-reduces under study.
        self._comm.all_gather_single(out, x, hints={"low_precision": "off"})


class FerroFused(Ferro):
    """`Comm.all_reduce_rmsnorm`: all-reduce of `x` plus `residual` into `residual` (in place),
    RMSNorm of it times `weight` into `x`."""

    def __init__(self, name, comm, lp=None, algo="auto", lp_min_bytes=0):
        if not callable(getattr(comm, "all_reduce_rmsnorm", None)):
            import ferrocomm

            raise BenchArgumentError(
                f"path {name} needs Comm.all_reduce_rmsnorm (the fused all-reduce + residual + "
                f"RMSNorm), which the installed ferrocomm {ferrocomm.__version__} "
                f"({ferrocomm.__file__}) does not have")
        super().__init__(name, comm, lp, algo, lp_min_bytes)

    def add_norm(self, x, residual, weight, eps):
        self._comm.all_reduce_rmsnorm(x, residual, weight, eps, hints=self.hints(x))
        return x, residual


def parse_paths(text):
    """The comma-separated path list of --paths, checked."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise BenchArgumentError("--paths is empty")
    for p in names:
        if p not in PATHS:
            raise BenchArgumentError(f"unknown path {p!r} in --paths; known: {', '.join(PATHS)}")
    if len(set(names)) != len(names):
        raise BenchArgumentError(f"--paths names a path twice: {text}")
    return names


class Group:
    """The process group of one run: torch.distributed (gloo always, NCCL when asked) and one
    ferrocomm communicator, created on every rank in the same order."""

    def __init__(self, device, want_nccl, timeout_s):
        import datetime

        import torch.distributed as dist

        self.dist, self.device, self.timeout_s = dist, device, timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group("gloo", timeout=timeout)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.nccl = dist.new_group(backend="nccl", timeout=timeout) if want_nccl else None
        self.comm = None

    def connect_ferrocomm(self):
        """The ferrocomm communicator, meeting through torch.distributed's store."""
        import ferrocomm

        store = self.dist.PrefixStore("ferrocomm-bench-model",
                                      self.dist.distributed_c10d._get_default_store())
        self.comm = ferrocomm.new_comm("ferrocomm", self.device, "bench_model", store=store,
                                       rank=self.rank, size=self.world, timeout=self.timeout_s)

    def reducer(self, name, lp="e4m3", algo="auto", lp_min_bytes=0):
        if name == "none":
            return Reducer()
        if name == "nccl":
            return TorchDist("nccl", self.nccl, via_cpu=False)
        if name == "gloo":
            return TorchDist("gloo", None, via_cpu=True)
        low = lp if name.endswith("-lp") else None
        cls = FerroFused if name.startswith("ferrocomm-fused") else Ferro
        return cls(name, self.comm, low, algo, lp_min_bytes)

    def barrier(self):
        self.dist.barrier()

    def max(self, value):
        """The largest of every rank's `value` (a float)."""
        t = torch.tensor([float(value)], dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def close(self):
        if self.comm is not None:
            self.comm.finalize()
        self.dist.destroy_process_group()

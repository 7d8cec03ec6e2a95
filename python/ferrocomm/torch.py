"""ferrocomm as a torch.distributed backend: ``"ferrocomm"``.

    import ferrocomm.torch                      # optional: the package's entry point does it
    dist.init_process_group("ferrocomm")        # was: "nccl"

The backend is a Python ``torch.distributed.ProcessGroup`` subclass over ferrocomm's
communicators: CUDA tensors go through a communicator on their GPU (created by the group's first
CUDA call), CPU tensors through the host backend (or gloo, for ``"cpu:gloo,cuda:ferrocomm"``).
CUDA calls are issued on the caller's current stream and never block the host, so they can be
captured in CUDA graphs; functional collectives and ``torch.compile`` reach the same methods
through the group's registered name. docs/torch.md describes it.
"""

import datetime
import math
import sys
import threading
import zlib

import torch
import torch.distributed as dist

from . import _comm
from ._comm import _check_hints, new_comm
from ._errors import FerrocommUnsupported, FerrocommValueError
from ._ops import ReduceOp

__all__ = ["Options", "ProcessGroupFerrocomm", "hints", "register"]

NAME = "ferrocomm"


class Options:
    """``pg_options`` for ``init_process_group`` / ``new_group`` with the ``"ferrocomm"``
    backend: default hints for every call of the group (``{"low_precision": "e4m3"}``, see
    docs/python.md) and the group's timeout (torch's ``timeout=`` applies when it is None)."""

    def __init__(self, hints=None, timeout=None):
        self.hints = _check_hints(hints, "ferrocomm.torch.Options")
        self.timeout = timeout

    def __repr__(self):
        return f"ferrocomm.torch.Options(hints={self.hints!r}, timeout={self.timeout!r})"


class _Local(threading.local):
    # A class default: reading a thread's hints outside any block is a plain attribute read,
    # not a failed lookup (a microsecond on every call).
    hints = None


_local = _Local()


class hints:  # noqa: N801 (used as a function: ``with hints(...)``)
    """Per-call hints for the ``"ferrocomm"`` collectives this thread issues inside the block
    (``with ferrocomm.torch.hints(low_precision="e4m3"): dist.all_reduce(t)``). They apply
    where the call runs: eagerly, while a CUDA graph is captured, or when a compiled function's
    collective executes. Blocks nest (inner keys win); a plain class rather than a generator,
    since it is entered around single calls."""

    __slots__ = ("_new", "_old")

    def __init__(self, **kw):
        self._new = _check_hints(kw, "ferrocomm.torch.hints")
        self._old = _OUTSIDE

    def __enter__(self):
        if self._old is not _OUTSIDE:
            raise RuntimeError("ferrocomm.torch.hints: this block is entered already")
        old = self._old = _local.hints
        # The dicts in _local are never changed in place, so the block's own can be shared.
        _local.hints = {**old, **self._new} if old else self._new
        return None

    def __exit__(self, exc_type, exc, tb):
        _local.hints, self._old = self._old, _OUTSIDE
        return False


_OUTSIDE = object()


def _call_hints():
    return _local.hints


_OPS = {}


def _op(opts):
    """ferrocomm's ReduceOp for torch's options object."""
    # Keyed by the operator's number: hashing torch's RedOpType enum object costs microseconds
    # on every call. (PREMUL_SUM, whose factor torch keeps in C++, is refused, never cached.)
    red = opts.reduceOp
    kind = int(red.op)
    op = _OPS.get(kind)
    if op is None:
        try:
            op = _OPS[kind] = ReduceOp.coerce(red)
        except ValueError as e:
            raise FerrocommUnsupported(f"ferrocomm backend: {e}") from None
    return op


class _Work(dist.Work):
    """torch's Work over ferrocomm's: ``wait()`` orders the current CUDA stream after the call
    (no host block) or, for CPU tensors, blocks until done; ``is_completed()`` polls;
    ``get_future()`` completes with the output tensors."""

    def __init__(self, pg, inner, result, cuda=False):
        # inner: ferrocomm's work objects of the call (empty for a call torch waits on at once:
        # done, or ordered on the caller's stream already); cuda: whether they are CUDA work.
        super().__init__()
        self._pg = pg
        self._inner = inner
        self._result = result
        self._cuda = cuda

    def wait(self, timeout=None):
        if self._pg._p2p:
            self._pg._flush_p2p()
        if self._cuda:
            for w in self._inner:
                w.wait()
            return True
        for w in self._inner:
            w.wait(None if not timeout else _seconds(timeout))
        return True

    def is_completed(self):
        self._pg._flush_p2p()
        return all(w.is_completed() for w in self._inner)

    def is_success(self):
        return self.is_completed()

    def get_future(self):
        self._pg._flush_p2p()
        if self._cuda and self._inner:
            # The current stream ordered after the call: the result is ready on it, where the
            # future records its own event.
            self.wait()
            fut = torch.futures.Future(devices=[torch.device("cuda", self._inner[0]._device)])
            fut.set_result(self._result)
            return fut
        fut = torch.futures.Future()
        if self.is_completed():
            self.wait()
            fut.set_result(self._result)
            return fut

        def finish():
            try:
                self.wait()
                fut.set_result(self._result)
            except Exception as e:  # noqa: BLE001 (handed to the future)
                fut.set_exception(e)

        threading.Thread(target=finish, name="ferrocomm-future", daemon=True).start()
        return fut


def _seconds(t):
    return t.total_seconds() if isinstance(t, datetime.timedelta) else float(t)


class ProcessGroupFerrocomm(dist.ProcessGroup):
    """The ``"ferrocomm"`` process group (created by torch.distributed, not by hand)."""

    def __init__(self, store, rank, size, timeout, group_name, options=None, cpu_backend=None):
        super().__init__(rank, size)
        self._store = store
        self._timeout = options.timeout if options and options.timeout else timeout
        self._group_name = str(group_name)
        self._group_desc = ""
        self._hints = dict(options.hints) if options else {}
        self._cuda = {}
        self._p2p = []
        self._p2p_works = []
        self._cpu_gloo = cpu_backend
        self._host = None
        # What a call torch waits on at once returns (done, or ordered on the caller's stream
        # already): one object, not one per call.
        self._waited = _Work(self, (), [])
        if cpu_backend is None:
            self._host = self._new_comm("host", "cpu")

    # -- what torch asks of a process group ------------------------------------------------

    def getBackendName(self):  # noqa: N802 (torch's spelling)
        return NAME

    def name(self):
        return NAME

    def getGroupName(self):  # noqa: N802
        return self._group_name

    def setGroupName(self, name):  # noqa: N802
        self._group_name = str(name)

    def getGroupDesc(self):  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc):  # noqa: N802
        self._group_desc = str(desc)

    @property
    def group_name(self):
        return self._group_name

    @property
    def group_desc(self):
        return self._group_desc

    def abort(self):
        for c in self._comms():
            c.abort()

    def set_timeout(self, timeout):
        """The timeout of the group's later calls (its communicators', and those it creates
        later)."""
        if not isinstance(timeout, datetime.timedelta) or not timeout.total_seconds() > 0:
            raise FerrocommValueError(
                f"ferrocomm backend: set_timeout takes a positive timedelta, not {timeout!r}")
        self._timeout = timeout
        for c in self._comms():
            c.set_timeout(timeout)

    def get_group_store(self):
        return self._store

    # torch asks a group for its c10d backend per device and for the backend's features. The
    # ferrocomm group is its own backend (for CPU tensors gloo's, with "cpu:gloo,..."); it
    # splits, coalesces and estimates through none of c10d's backend hooks.
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_tensor_alloc = False
    supports_shrinking = False

    def _get_backend(self, device):
        kind = torch.device(device).type
        if kind == "cpu" and self._host is None:
            return self._cpu_gloo
        if kind not in ("cpu", "cuda"):
            raise FerrocommValueError(f"ferrocomm backend: no backend for device type {kind}")
        return self

    @property
    def options(self):
        return Options(self._hints, self._timeout)

    def eager_connect_single_device(self, device):
        """Creates the group's communicator for ``device`` now (collective: every rank calls
        it), rather than at its first call."""
        self.comm(device)

    def _start_coalescing(self, device):
        # Sends and receives are queued until the block ends (as always); collectives in the
        # block run as they are called.
        self._flush_p2p()

    def _end_coalescing(self, device):
        """The block's sends and receives issued as one batch; its work."""
        works = self._p2p_works
        self._flush_p2p()
        if not works:
            return _Work(self, (), [])
        return _Work(self, works[0]._inner, [], works[0]._cuda)

    def shutdown(self):
        for c in self._comms():
            c.finalize()

    def comm(self, device):
        """The ferrocomm communicator serving ``device`` (a torch.device or string)."""
        d = torch.device(device)
        if d.type == "cpu":
            if self._host is None:
                raise FerrocommValueError("this group's CPU tensors go through gloo")
            return self._host
        return self._cuda_comm(d.index if d.index is not None else torch.cuda.current_device())

    def comm_for(self, t):
        """The communicator a call on tensor ``t`` runs on, after the pending sends and
        receives (as before any collective of the group)."""
        if self._p2p:
            self._flush_p2p()
        return self.comm(t.device)

    # -- plumbing --------------------------------------------------------------------------

    def _new_comm(self, backend, device):
        # The name is the same on every rank: the device type, not its index (ranks of one
        # group usually hold different GPUs).
        kind = torch.device(device).type
        return new_comm(backend, device, f"torch/{self._group_name}/{kind}",
                        timeout=self._timeout, store=self._store, hints=self._hints,
                        rank=self.rank(), size=self.size())

    def _comms(self):
        return ([self._host] if self._host is not None else []) + list(self._cuda.values())

    def _cuda_comm(self, index):
        c = self._cuda.get(index)
        if c is None:
            if self._cuda:
                raise FerrocommValueError(
                    f"ferrocomm backend: this group serves cuda:{next(iter(self._cuda))}; a "
                    f"tensor on cuda:{index} needs a group of its own")
            # Every rank reaches its first CUDA call in the same order, so they meet here.
            with torch.cuda.device(index):
                c = self._new_comm("ferrocomm", f"cuda:{index}")
            self._cuda[index] = c
        return c

    def _run(self, t, opts, call, result, gloo=None):
        """Runs `call(comm, async_op, hints)` on the communicator serving tensor `t`."""
        if self._p2p:
            self._flush_p2p()
        h = _local.hints
        # A call torch waits on at once needs no stream or work of its own: wait() is a no-op.
        waited = opts is not None and not getattr(opts, "asyncOp", True)
        # is_cuda / get_device() build no torch.device object.
        if t.is_cuda:
            index = t.get_device()
            c = self._cuda.get(index)
            if c is None:
                c = self._cuda_comm(index)
            if waited:
                call(c, False, h)
                return self._waited
            return _Work(self, (call(c, True, h),), result, True)
        if not t.is_cpu:
            raise FerrocommValueError(
                f"ferrocomm backend: tensors on {t.device} are not supported")
        if self._host is None:
            return gloo()
        # CPU: a call torch waits on at once runs here (no hop to the work thread).
        if waited:
            call(self._host, False, h)
            return self._waited
        return _Work(self, (call(self._host, True, h),), result)

    # -- collectives (torch's ProcessGroup signatures) ---------------------------------------

    def allreduce(self, tensors, opts=None):
        op = _op(opts) if opts is not None else ReduceOp.SUM
        t = tensors[0] if len(tensors) == 1 else _one(tensors, "allreduce")
        try:
            return self._run(t, opts, lambda c, a, h: c.all_reduce(t, op, async_op=a, hints=h),
                             tensors, lambda: self._cpu_gloo.allreduce(tensors, opts))
        except FerrocommValueError:
            # Sparse tensors are refused as arguments natively; asked for here, not before,
            # so that dense calls pay nothing for it.
            if t.layout is torch.strided:
                raise
        return self._sparse_allreduce(t, op, tensors)

    def _sparse_allreduce(self, t, op, result):
        """A sparse COO all-reduce as gloo does it: every rank's indices and values gathered,
        the same concatenation summed by index on every rank (so every rank gets the same
        bits), the sum copied into ``t``."""
        if t.layout is not torch.sparse_coo:
            raise FerrocommUnsupported(
                f"ferrocomm backend: all_reduce of a {t.layout} tensor is not supported (sparse "
                "COO tensors are summed)")
        if op is not ReduceOp.SUM:
            raise FerrocommUnsupported(
                f"ferrocomm backend: all_reduce of a sparse tensor sums (ReduceOp.SUM); {op} is "
                "not supported")
        c = self.comm_for(t)
        s = t.coalesce()
        idx, vals = s.indices(), s.values()
        # What every rank's tensor must share, with its number of entries.
        shape_key = zlib.crc32(repr((tuple(t.shape), str(t.dtype), s.sparse_dim())).encode())
        mine = torch.tensor([s._nnz(), shape_key], dtype=torch.int64, device=t.device)
        heads = torch.empty(2 * self.size(), dtype=torch.int64, device=t.device)
        c.all_gather_single(heads, mine)
        heads = heads.view(self.size(), 2).tolist()
        for r, (_, key) in enumerate(heads):
            if key != shape_key:
                raise FerrocommValueError(
                    f"ferrocomm backend: all_reduce of a sparse tensor: rank {r}'s tensor differs "
                    f"from this rank's {tuple(t.shape)} {t.dtype} with {s.sparse_dim()} sparse "
                    "dimensions in shape, dtype or sparse dimensions")
        # A peer's count sizes this rank's buffers: at most one entry per sparse index.
        most = math.prod(t.shape[:s.sparse_dim()])
        nnz = [n for n, _ in heads]
        for r, n in enumerate(nnz):
            if not 0 <= n <= most:
                raise FerrocommValueError(
                    f"ferrocomm backend: all_reduce of a sparse tensor: rank {r} reports {n} "
                    f"entries; a coalesced {tuple(t.shape)} tensor has 0 to {most}")
        per_value = math.prod(vals.shape[1:])
        idx_parts = [idx.new_empty(s.sparse_dim() * n) for n in nnz]
        val_parts = [vals.new_empty(per_value * n) for n in nnz]
        c.all_gather_v(idx_parts, idx.contiguous().view(-1))
        c.all_gather_v(val_parts, vals.contiguous().view(-1))
        indices = torch.cat([p.view(s.sparse_dim(), n) for p, n in zip(idx_parts, nnz)], 1)
        values = torch.cat([p.view((n,) + tuple(vals.shape[1:]))
                            for p, n in zip(val_parts, nnz)])
        # check_invariants: indices from peers are checked against the shape before use.
        total = torch.sparse_coo_tensor(indices, values, t.shape, check_invariants=True)
        t.copy_(total.coalesce())
        return _Work(self, (), result)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op(opts) if opts is not None else ReduceOp.SUM
        works = [self._run(t, opts,
                           lambda c, a, h, t=t: c.all_reduce(t, op, async_op=a, hints=h),
                           [t], lambda t=t: self._cpu_gloo.allreduce_coalesced([t], opts))
                 for t in tensors]
        return _joined(self, works, tensors)

    def reduce(self, tensors, opts):
        op = _op(opts)
        t = _one(tensors, "reduce")
        root = opts.rootRank
        return self._run(t, opts, lambda c, a, h: c.reduce(t, root, op, async_op=a, hints=h),
                         tensors, lambda: self._cpu_gloo.reduce(tensors, opts))

    def broadcast(self, tensors, opts):
        t = _one(tensors, "broadcast")
        root = opts.rootRank
        return self._run(t, opts, lambda c, a, h: c.broadcast(t, root, async_op=a, hints=h),
                         tensors, lambda: self._cpu_gloo.broadcast(tensors, opts))

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "allgather")
        outs = _one(output_tensors, "allgather")
        # Outputs of different sizes (as NCCL's group allows): the all-gather-v.
        f = "all_gather" if len({o.numel() for o in outs}) <= 1 else "all_gather_v"
        return self._run(t, opts, lambda c, a, h: getattr(c, f)(outs, t, async_op=a, hints=h),
                         output_tensors,
                         lambda: self._cpu_gloo.allgather(output_tensors, input_tensors, opts))

    def _allgather_base(self, output, input, opts=None):  # noqa: A002
        return self._run(input, opts,
                         lambda c, a, h: c.all_gather_single(output, input, async_op=a, hints=h),
                         [output], lambda: self._cpu_gloo._allgather_base(output, input, opts))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(self, works, outputs)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``output_lists[r][i]`` receives rank r's ``input_list[i]``: one all-gather of the
        inputs flattened into one buffer, copied out part by part."""
        what = "all_gather_coalesced"
        n = self.size()
        if len(output_lists) != n:
            raise FerrocommValueError(
                f"ferrocomm backend: {what}: output_tensor_lists has {len(output_lists)} lists "
                f"for {n} ranks")
        if not input_list:
            raise FerrocommValueError(f"ferrocomm backend: {what}: input_tensor_list is empty")
        first = input_list[0]
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise FerrocommValueError(
                    f"ferrocomm backend: {what}: output_tensor_lists[{r}] has {len(outs)} "
                    f"tensors for {len(input_list)} inputs")
            for i, (o, x) in enumerate(zip(outs, input_list)):
                if o.numel() != x.numel() or o.dtype != first.dtype or o.device != first.device:
                    raise FerrocommValueError(
                        f"ferrocomm backend: {what}: output_tensor_lists[{r}][{i}] is "
                        f"{o.numel()} elements of {o.dtype} on {o.device}; input_tensor_list"
                        f"[{i}] is {x.numel()} elements of {first.dtype} on {first.device}")
        flat_in = torch.cat([x.reshape(-1) for x in input_list])
        count = flat_in.numel()
        flat_out = flat_in.new_empty(n * count)

        def copy_out():
            for r, outs in enumerate(output_lists):
                at = r * count
                for o in outs:
                    o.copy_(flat_out[at:at + o.numel()].view(o.shape))
                    at += o.numel()

        w = self._run(flat_in, opts,
                      lambda c, a, h: c.all_gather_single(flat_out, flat_in, async_op=a, hints=h),
                      output_lists,
                      lambda: self._cpu_gloo.allgather_coalesced(output_lists, input_list, opts))
        if not isinstance(w, _Work):
            return w  # gloo's
        if w is self._waited or w._cuda:
            # Done, or enqueued on the current stream: the copies go after it there.
            copy_out()
            if w is self._waited:
                return w
            return _Work(self, (_StreamPoint(flat_in.get_device()),), output_lists, True)
        return _Work(self, (_Then(w._inner[0], copy_out),), output_lists)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op(opts) if opts is not None else ReduceOp.SUM
        t = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        f = "reduce_scatter" if len({i.numel() for i in ins}) <= 1 else "reduce_scatter_v"
        return self._run(t, opts, lambda c, a, h: getattr(c, f)(t, ins, op, async_op=a, hints=h),
                         output_tensors,
                         lambda: self._cpu_gloo.reduce_scatter(output_tensors, input_tensors,
                                                               opts))

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        op = _op(opts) if opts is not None else ReduceOp.SUM
        return self._run(output, opts,
            lambda c, a, h: c.reduce_scatter_single(output, input, op, async_op=a, hints=h),
            [output], lambda: self._cpu_gloo._reduce_scatter_base(output, input, opts))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return _joined(self, works, outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):
        osz = list(output_split_sizes) or None
        isz = list(input_split_sizes) or None
        return self._run(input, opts,
            lambda c, a, h: c.all_to_all_single(output, input, a, h, output_split_sizes=osz,
                                                input_split_sizes=isz),
            [output], lambda: self._cpu_gloo.alltoall_base(output, input, output_split_sizes,
                                                           input_split_sizes, opts))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._run(input_tensors[0], opts,
            lambda c, a, h: c.all_to_all(output_tensors, input_tensors, async_op=a, hints=h),
            output_tensors, lambda: self._cpu_gloo.alltoall(output_tensors, input_tensors, opts))

    def gather(self, output_tensors, input_tensors, opts):
        t = _one(input_tensors, "gather")
        root = opts.rootRank
        outs = output_tensors[0] if self.rank() == root else None
        return self._run(t, opts, lambda c, a, h: c.gather(outs, t, root, async_op=a, hints=h),
                         output_tensors,
                         lambda: self._cpu_gloo.gather(output_tensors, input_tensors, opts))

    def scatter(self, output_tensors, input_tensors, opts):
        t = _one(output_tensors, "scatter")
        root = opts.rootRank
        ins = input_tensors[0] if self.rank() == root else None
        return self._run(t, opts, lambda c, a, h: c.scatter(t, ins, root, async_op=a, hints=h),
                         output_tensors,
                         lambda: self._cpu_gloo.scatter(output_tensors, input_tensors, opts))

    def barrier(self, opts=None):
        self._flush_p2p()
        # Like NCCL's barrier, it also waits for this rank's CUDA work of the group.
        for index in self._cuda:
            torch.cuda.current_stream(index).synchronize()
        if self._host is None:
            return self._cpu_gloo.barrier(opts) if opts is not None else self._cpu_gloo.barrier()
        return _Work(self, (self._host.barrier(async_op=True),), [])

    # -- point to point: deferred and issued together -------------------------------------------
    # Sends and receives are queued and issued as one batch (ferrocomm's BatchSendRecv) when a
    # work of theirs is waited on or polled, or before the group's next collective: so
    # batch_isend_irecv's exchanges (every rank sending before receiving) cannot deadlock.

    def send(self, tensors, dst, tag=0):
        return self._p2p_op(True, _one(tensors, "send"), dst, tensors,
                            lambda: self._cpu_gloo.send(tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        return self._p2p_op(False, _one(tensors, "recv"), src, tensors,
                            lambda: self._cpu_gloo.recv(tensors, src, tag))

    def recv_anysource(self, tensors, tag=0):
        raise FerrocommUnsupported("ferrocomm backend: recv from any source is not supported")

    # What torch's ProcessGroup offers and ferrocomm does not: each raises FerrocommUnsupported
    # naming the call, instead of reaching torch's base class (which fails for a group without
    # c10d backends, or crashes: split_group).
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        _unsupported("monitored_barrier", "torch runs it on gloo only; barrier() reports the "
                     "rank it waited for when it times out")

    def split_group(self, *args, **kwargs):
        _unsupported("split_group", "use new_group(ranks, backend=\"ferrocomm\")")

    def merge_remote_group(self, *args, **kwargs):
        _unsupported("merge_remote_group")

    def _register_on_completion_hook(self, hook):
        _unsupported("_register_on_completion_hook", "completion hooks are NCCL's")

    def _wait_for_pending_works(self):
        _unsupported("_wait_for_pending_works", "it waits for completion hooks, which are "
                     "NCCL's")

    def _enable_collectives_timing(self):
        _unsupported("_enable_collectives_timing", "collective timing is NCCL's")

    def _set_sequence_number_for_group(self):
        _unsupported("_set_sequence_number_for_group", "sequence numbers are gloo's and NCCL's")

    def _get_sequence_number_for_group(self):
        _unsupported("_get_sequence_number_for_group", "sequence numbers are gloo's and NCCL's")

    def _backend_id(self, backend_type):
        _unsupported("_backend_id", "the group has no c10d backends")

    def _p2p_op(self, is_send, t, peer, result, gloo):
        if t.device.type == "cpu" and self._host is None:
            return gloo()
        if self._p2p and self._p2p[0][1].device != t.device:
            self._flush_p2p()
        if not 0 <= int(peer) < self.size():
            raise FerrocommValueError(
                f"ferrocomm backend: {'send' if is_send else 'recv'} peer {peer} out of range "
                f"for {self.size()} ranks")
        self._p2p.append((is_send, t, int(peer)))
        # Its ferrocomm work is the batch's, set when the batch is issued.
        w = _Work(self, (), result, t.device.type == "cuda")
        self._p2p_works.append(w)
        return w

    def _flush_p2p(self):
        if not self._p2p:
            return
        ops, works = self._p2p, self._p2p_works
        self._p2p, self._p2p_works = [], []
        dev = ops[0][1].device
        c = self._cuda_comm(dev.index) if dev.type == "cuda" else self._host
        batch = c.batch_op_create()
        for is_send, t, peer in ops:
            (batch.send if is_send else batch.recv)(t, peer)
        inner = batch.issue(async_op=True, hints=_call_hints())
        for w in works:
            w._inner = (inner,)


class _Then:
    """A host work followed by a step run once, in the first wait that sees it done."""

    __slots__ = ("_w", "_after")

    def __init__(self, w, after):
        self._w = w
        self._after = after

    def wait(self, timeout=None):
        self._w.wait(timeout)
        after, self._after = self._after, None
        if after is not None:
            after()

    def is_completed(self):
        return self._w.is_completed()


class _StreamPoint:
    """The current CUDA stream's point after the last work enqueued on it (a torch event):
    waiting orders the waiter's current stream after it."""

    __slots__ = ("_event", "_device")

    def __init__(self, device):
        self._device = device
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(device))

    def wait(self, timeout=None):
        torch.cuda.current_stream(self._device).wait_event(self._event)

    def is_completed(self):
        return self._event.query()


class _TorchWork:
    """A torch Work among a coalesced call's works (gloo's, for the CPU tensors of
    "cpu:gloo,cuda:ferrocomm"), waited on as ferrocomm's are."""

    __slots__ = ("_w",)

    def __init__(self, w):
        self._w = w

    def wait(self, timeout=None):
        if timeout is None:
            self._w.wait()
        else:
            self._w.wait(datetime.timedelta(seconds=timeout))

    def is_completed(self):
        return self._w.is_completed()


def _joined(pg, works, result):
    """One work for a coalesced call's works."""
    if len(works) == 1:
        return works[0]
    inner = tuple(i for w in works
                  for i in (w._inner if isinstance(w, _Work) else (_TorchWork(w),)))
    return _Work(pg, inner, result, any(isinstance(w, _Work) and w._cuda for w in works))


def _unsupported(call, hint=""):
    raise FerrocommUnsupported(f"ferrocomm backend: {call} is not supported"
                               + (f" ({hint})" if hint else ""))


def _one(lst, what):
    if len(lst) != 1:
        raise FerrocommValueError(
            f"ferrocomm backend: {what} takes one tensor per process (got {len(lst)})")
    return lst[0]


def _cpu_backend_of_caller(store, rank, size, timeout):
    """For ``backend="cpu:gloo,cuda:ferrocomm"``: a gloo backend for CPU tensors.

    torch hands a Python process group the whole group (it replaces the ProcessGroup torch
    built), so the gloo backend torch created for the CPU is dropped; the group's device map is
    read from torch's group-creation frame and gloo is created again here on the same store.
    """
    frame = sys._getframe(2)
    config = None
    while frame is not None and config is None:
        if frame.f_code.co_name == "_new_process_group_helper":
            config = frame.f_locals.get("backend_config")
        frame = frame.f_back
    if config is None:
        return None
    mapping = config.get_device_backend_map()
    cpu = mapping.get("cpu", NAME)
    if mapping.get("cuda", NAME) != NAME:
        raise FerrocommUnsupported(
            f"ferrocomm backend: {config} puts CUDA tensors on {mapping['cuda']}; ferrocomm "
            "serves CUDA (and optionally CPU) tensors: use 'cuda:ferrocomm' or 'ferrocomm'")
    if cpu == NAME:
        return None
    if cpu != "gloo":
        raise FerrocommUnsupported(
            f"ferrocomm backend: CPU tensors can go through ferrocomm or gloo, not {cpu}")
    return dist.ProcessGroupGloo(dist.PrefixStore("ferrocomm-gloo/", store), rank, size,
                                 timeout)


def _create(dist_opts, pg_options):
    """torch's creator for the backend (extended API)."""
    if pg_options is not None and not isinstance(pg_options, Options):
        if isinstance(pg_options, dict):
            pg_options = Options(**pg_options)
        else:
            raise FerrocommValueError(
                "ferrocomm backend: pg_options must be ferrocomm.torch.Options or a dict, not "
                f"{type(pg_options).__name__}")
    store, rank, size = dist_opts.store, dist_opts.group_rank, dist_opts.group_size
    timeout = dist_opts.timeout
    gloo = _cpu_backend_of_caller(store, rank, size, timeout)
    return ProcessGroupFerrocomm(store, rank, size, timeout, dist_opts.group_id, pg_options,
                                 gloo)


def register():
    """Registers ``"ferrocomm"`` with torch.distributed for CPU and CUDA (idempotent)."""
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


register()

# Reachable as ferrocomm.torch.Comm for users mixing the two APIs.
Comm = _comm.Comm

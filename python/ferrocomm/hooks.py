"""Hooks on a communicator (torchcomms' ``register_pre_hook``, ``register_post_hook``,
``register_abort_hook``) and ``FlightRecorderHook``.

A pre-hook is called as ``hook(name: OpName, op_id: int, args)`` before every call, with the
call's arguments in ``args`` (``AllReducePreHookArgs`` with ``tensor``, ``op``,
``async_op``, ...); a post-hook as ``hook(op_id, args)`` after it, ``args.work`` being the
work the call returned. Op ids grow across every communicator of the process and pair the two.
An abort hook is called (without arguments) once, when the communicator is aborted: by
``abort()``, a timeout, or its watcher seeing a peer die or give up (then on the watcher's
thread). A communicator without pre- or post-hooks runs its calls as if hooks did not exist:
the wrappers that call them are installed on the instance with the first hook and removed
with the last.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import os
import pickle
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from . import _native

if TYPE_CHECKING:
    from ._comm import Comm

__all__ = [
    "OpName",
    "RemovableHandle",
    "PreHookArgs",
    "PostHookArgs",
    "FlightRecorderHook",
]


class OpName(enum.Enum):
    """The operation a hook is called for (torchcomms' OpName)."""

    send = enum.auto()
    recv = enum.auto()
    broadcast = enum.auto()
    all_reduce = enum.auto()
    reduce = enum.auto()
    all_gather = enum.auto()
    all_gather_v = enum.auto()
    all_gather_single = enum.auto()
    reduce_scatter = enum.auto()
    reduce_scatter_v = enum.auto()
    reduce_scatter_single = enum.auto()
    all_to_all_single = enum.auto()
    all_to_all_v_single = enum.auto()
    all_to_all = enum.auto()
    barrier = enum.auto()
    scatter = enum.auto()
    gather = enum.auto()
    gather_single = enum.auto()
    split = enum.auto()
    new_window = enum.auto()
    batch_op_issue = enum.auto()
    finalize = enum.auto()
    # ferrocomm's own calls beyond torchcomms'.
    all_to_all_v_dynamic = enum.auto()
    device_alltoallv_single = enum.auto()
    all_reduce_rmsnorm = enum.auto()


class RemovableHandle:
    """Returned by a registration; ``remove()`` unregisters the hook."""

    def __init__(self, remove: Callable[[], object]) -> None:
        self._remove: Optional[Callable[[], object]] = remove

    def remove(self) -> None:
        r, self._remove = self._remove, None
        if r is not None:
            r()


class PreHookArgs:
    """A call's arguments, as attributes (the subclass names the call)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={type(v).__name__ if hasattr(v, 'shape') else v!r}"
                          for k, v in self.__dict__.items())
        return f"{type(self).__name__}({inner})"


class PostHookArgs:
    """What a call returned: ``work`` (a split's ``new_comm``)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


# A pre-hook: (the operation, its op id, the call's arguments).
PreHook = Callable[[OpName, int, PreHookArgs], object]
# A post-hook: (the op id, what the call returned).
PostHook = Callable[[int, PostHookArgs], object]


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


_PRE = {op: type(f"{_camel(op.name)}PreHookArgs", (PreHookArgs,), {}) for op in OpName}
_POST = {op: type(f"{_camel(op.name)}PostHookArgs", (PostHookArgs,), {}) for op in OpName}
for _op in OpName:
    globals()[_PRE[_op].__name__] = _PRE[_op]
    globals()[_POST[_op].__name__] = _POST[_op]
    __all__ += [_PRE[_op].__name__, _POST[_op].__name__]

# Comm's methods that hooks see, and the names torchcomms gives their arguments where ours differ.
_METHODS = {
    "all_reduce": {}, "reduce": {}, "broadcast": {}, "barrier": {},
    "all_gather": {"tensor_list": "output", "tensor": "input"},
    "all_gather_single": {}, "all_gather_v": {"tensor_list": "output", "tensor": "input"},
    "reduce_scatter": {"input_list": "input"}, "reduce_scatter_single": {},
    "reduce_scatter_v": {"input_list": "input"},
    "all_to_all": {"output_tensor_list": "output", "input_tensor_list": "input"},
    "all_to_all_single": {}, "all_to_all_v_single": {}, "all_to_all_v_dynamic": {},
    "device_alltoallv_single": {},
    "scatter": {}, "gather": {}, "gather_single": {},
    "send": {"dst": "peer"}, "recv": {"src": "peer"},
    "split": {}, "finalize": {}, "all_reduce_rmsnorm": {},
}
# Not arguments of the operation.
_SKIP = ("self", "hints", "timeout")
# torchcomms' finalize op id (finalize takes none of the process's numbering).
FINALIZE_OP_ID = 2**64 - 1


class _Hooks:
    """The hooks of one communicator."""

    def __init__(self) -> None:
        self.pre: dict[int, PreHook] = {}
        self.post: dict[int, PostHook] = {}
        self.next = 0


def _hooked(comm: Comm, hooks: _Hooks, name: str, fn: Callable[..., Any],
            renames: Mapping[str, str]) -> Callable[..., Any]:
    sig = inspect.signature(fn)
    op = OpName[name]

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        op_id = FINALIZE_OP_ID if op is OpName.finalize else _native.next_op_id()
        bound = sig.bind(comm, *args, **kw)
        bound.apply_defaults()
        fields = {renames.get(k, k): v for k, v in bound.arguments.items() if k not in _SKIP}
        pre = _PRE[op](**fields)
        for pre_hook in list(hooks.pre.values()):
            pre_hook(op, op_id, pre)
        out = fn(comm, *args, **kw)
        post = _POST[op](new_comm=out) if op is OpName.split else _POST[op](work=out)
        for post_hook in list(hooks.post.values()):
            post_hook(op_id, post)
        return out

    return call


def _install(comm: Comm, hooks: _Hooks) -> None:
    for name, renames in _METHODS.items():
        fn = getattr(type(comm), name, None)
        if fn is not None:
            setattr(comm, name, _hooked(comm, hooks, name, fn, renames))
    setattr(comm, "allreduce", comm.all_reduce)


def _uninstall(comm: Comm) -> None:
    for name in list(_METHODS) + ["allreduce"]:
        comm.__dict__.pop(name, None)


def register(comm: Comm, kind: str, fn: Any) -> RemovableHandle:
    """Registers pre- or post-hook `fn` on `comm` (Comm.register_pre_hook/_post_hook)."""
    if not callable(fn):
        raise TypeError(f"register_{kind}_hook: the hook must be callable, not {fn!r}")
    hooks: _Hooks = comm.__dict__.setdefault("_hooks", _Hooks())
    if not hooks.pre and not hooks.post:
        _install(comm, hooks)
    hooks.next += 1
    key = hooks.next
    if kind == "pre":
        hooks.pre[key] = fn
    else:
        hooks.post[key] = fn

    def remove() -> None:
        hooks.pre.pop(key, None)
        hooks.post.pop(key, None)
        if not hooks.pre and not hooks.post:
            _uninstall(comm)

    return RemovableHandle(remove)


class FlightRecorderHook:
    """torchcomms' FlightRecorderHook over ferrocomm's own flight recorder: it records the
    calls of the communicators it is registered with (and of their splits) from its
    registration or its last ``reset()`` on, in torch's flight-recorder format (so that
    ``python -m torch.distributed.flight_recorder.fr_trace`` reads ``dump_file``'s files).
    Every communicator records its calls anyway (``FERROCOMM_FLIGHT_RECORDER``, on by
    default); registering turns its recorder on with ``max_entries`` calls when it was off."""

    def __init__(self, max_entries: int = 2048, isolated: bool = False) -> None:
        del isolated  # every communicator's recorder is its own already
        if max_entries < 1:
            raise ValueError(f"FlightRecorderHook: max_entries must be positive, got {max_entries}")
        self._max = int(max_entries)
        # Each registered communicator and the record id its dump starts at.
        self._comms: list[tuple[Comm, int]] = []

    def register_with_comm(self, comm: Comm) -> None:
        since, _ = comm._n.flight_recorder_enable(self._max)
        self._comms.append((comm, since))
        hooks: list[FlightRecorderHook] = comm.__dict__.setdefault("_fr_hooks", [])
        hooks.append(self)

    def unregister(self) -> None:
        for c, _ in self._comms:
            hs: list[FlightRecorderHook] = c.__dict__.get("_fr_hooks", [])
            if self in hs:
                hs.remove(self)
        self._comms = []

    def is_enabled(self) -> bool:
        return bool(self._comms)

    def reset(self) -> None:
        self._comms = [(c, c._n.flight_recorder_len()[1]) for c, _ in self._comms]

    def _dump(self, include_completed: bool) -> dict[str, Any]:
        doc: Optional[dict[str, Any]] = None
        for comm, since in self._comms:
            d = json.loads(comm._n.flight_recorder_json(since, not include_completed))
            if doc is None:
                doc = d
            else:
                doc["pg_config"].update(d["pg_config"])
                doc["pg_status"].update(d["pg_status"])
                doc["entries"].extend(d["entries"])
        if doc is None:
            doc = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
        doc["entries"].sort(key=lambda e: e["record_id"])
        doc["entries"] = doc["entries"][-self._max:]
        return doc

    def size(self) -> int:
        """Calls recorded since registration or the last reset (at most ``max_entries``)."""
        return len(self._dump(True)["entries"])

    def dump_json(self, include_completed: bool = True) -> str:
        return json.dumps(self._dump(include_completed))

    def dump_file(self, rank: int, include_completed: bool = True) -> str:
        """Writes the dump (pickled, as torch's) to ``ferrocomm_trace_rank_<rank>`` in the
        trace directory of the first registered communicator; returns its path."""
        if not self._comms:
            raise RuntimeError("FlightRecorderHook.dump_file: no communicator registered")
        d = self._comms[0][0]._n.trace_dir
        os.makedirs(d, mode=0o700, exist_ok=True)
        path = os.path.join(d, f"ferrocomm_trace_rank_{int(rank)}")
        tmp = os.path.join(d, f".partial-{os.getpid()}-hook.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(self._dump(include_completed), f)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

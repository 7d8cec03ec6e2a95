"""ferrocomm's Python surface against torchcomms': every method of TorchComm and
TorchCommWindow, and new_comm, with torchcomms' parameters in torchcomms' positional order under
torchcomms' names; ferrocomm's own extras only as keywords after them.

The table is torchcomms' `comms/torchcomms/_comms.pyi` at commit
59426ba4bfee75800b2909274d200401c4d5d2df (meta-pytorch/torchcomms), where the binding at that
commit (`comms/torchcomms/TorchCommPy.cpp`, what Python actually calls) defines otherwise:
`new_comm` (its third parameter is `name`, and it has `is_high_priority_stream`) and
`TorchCommWindow.signal` (its first parameter is `peer_rank`; the stub says `dst_rank`).
docs/python.md lists every difference that remains; the last tests hold the two together.
"""

import inspect
import re
from pathlib import Path

import pytest

import ferrocomm

REQUIRED = inspect.Parameter.empty
HINTS_TIMEOUT = [("hints", None), ("timeout", None)]


def coll(*names):
    """A collective's parameters: `names` (required), then async_op (required), hints, timeout."""
    return [(n, REQUIRED) for n in names] + [("async_op", REQUIRED)] + HINTS_TIMEOUT


TORCH_COMM = {
    "finalize": [],
    "get_rank": [],
    "get_size": [],
    "get_name": [],
    "get_options": [],
    "get_device": [],
    "get_backend": [],
    "get_backend_version": [],
    "get_backend_impl": [],
    "unsafe_get_backend": [],
    "get_init_handle": [],
    "reconfigure": [("uuid", REQUIRED), ("init_handles", REQUIRED), ("timeout", None),
                    ("hints", None)],
    "abort": [],
    "is_abort_supported": [],
    "is_aborted": [],
    "set_timeout": [("timeout", REQUIRED)],
    "set_hints": [("hints", REQUIRED)],
    "send": coll("tensor", "dst"),
    "recv": coll("tensor", "src"),
    "broadcast": coll("tensor", "root"),
    "all_reduce": coll("tensor", "op"),
    "reduce": coll("tensor", "root", "op"),
    "all_gather": coll("tensor_list", "tensor"),
    "all_gather_v": coll("tensor_list", "tensor"),
    "all_gather_single": coll("output", "input"),
    "reduce_scatter": coll("output", "input_list", "op"),
    "reduce_scatter_v": coll("output", "input_list", "op"),
    "reduce_scatter_single": coll("output", "input", "op"),
    "all_to_all_single": coll("output", "input"),
    "all_to_all_v_single": coll("output", "input", "output_split_sizes", "input_split_sizes"),
    "all_to_all": coll("output_tensor_list", "input_tensor_list"),
    "barrier": coll(),
    "scatter": coll("output_tensor", "input_tensor_list", "root"),
    "gather": coll("output_tensor_list", "input_tensor", "root"),
    "gather_single": coll("output", "input", "root"),
    "split": [("ranks", REQUIRED), ("name", REQUIRED)] + HINTS_TIMEOUT,
    "batch_op_create": [],
    "new_window": [("tensor", None)],
    "all_gather_p_init": [("output", REQUIRED)] + HINTS_TIMEOUT,
    "all_gather_p_exec": coll("handle", "input"),
    "all_gather_p_free": [("handle", REQUIRED)],
    "get_mem_allocator": [],
    "register_pre_hook": [("callback", REQUIRED)],
    "register_post_hook": [("callback", REQUIRED)],
    "register_abort_hook": [("callback", REQUIRED)],
    "tensor_register": [("tensor", REQUIRED)],
    "tensor_deregister": [("tensor", REQUIRED)],
}

TORCH_COMM_WINDOW = {
    "get_size": [],
    "get_tensor": [],
    "tensor_register": [("tensor", REQUIRED), ("owning", True)],
    "tensor_deregister": [],
    "put": coll("tensor", "dst_rank", "target_offset_nelems"),
    "signal": coll("peer_rank"),
    "wait_signal": coll("peer_rank"),
    "map_remote_tensor": [("rank", REQUIRED)],
    "get_attr": [("peer_rank", REQUIRED)],
    "get_device_window": [("signal_count", -1), ("counter_count", -1), ("barrier_count", 1)],
    "register_local_buffer": [("tensor", REQUIRED)],
    "deregister_local_buffer": [("handle", REQUIRED)],
}

NEW_COMM = [("backend", REQUIRED), ("device", REQUIRED), ("name", REQUIRED),
            ("abort_process_on_timeout_or_error", None), ("timeout", None),
            ("is_high_priority_stream", None), ("store", None), ("enable_reconfigure", False),
            ("hints", None)]

# torchcomms' properties.
PROPERTIES = {"TorchComm": ["mem_allocator"], "TorchCommWindow": ["dtype", "shape", "device"]}

# What torchcomms has and ferrocomm lacks (docs/python.md lists each).
LACKING = {
    "TorchComm": ["get_backend_impl", "unsafe_get_backend", "get_init_handle", "reconfigure",
                  "get_mem_allocator", "mem_allocator", "tensor_register",
                  "tensor_deregister"],
    "TorchCommWindow": ["get_device_window", "register_local_buffer", "deregister_local_buffer"],
}

# Defaults ferrocomm gives where torchcomms requires the argument (calls that pass it behave
# alike; docs/python.md says so). new_comm's `name` defaults to None only so that leaving it
# out is a FerrocommValueError, as every argument error is.
EXTRA_DEFAULTS = {"async_op": False, "op": ferrocomm.ReduceOp.SUM, "name": None}


def differences(name, fn, want, skip_self=True):
    """Every way `fn`'s signature departs from `want` (a list of (name, default))."""
    params = list(inspect.signature(fn).parameters.values())
    if skip_self:
        params = params[1:]
    out = []
    for k, (pname, default) in enumerate(want):
        if k >= len(params):
            out.append(f"{name}: lacks parameter {k} `{pname}`")
            continue
        p = params[k]
        if p.name != pname:
            out.append(f"{name}: parameter {k} is `{p.name}`, torchcomms' is `{pname}`")
        if p.kind is not p.POSITIONAL_OR_KEYWORD:
            out.append(f"{name}: `{p.name}` is {p.kind.description}, not positional-or-keyword")
        if default is REQUIRED:
            if p.default is not REQUIRED and EXTRA_DEFAULTS.get(pname, object()) != p.default:
                out.append(f"{name}: `{pname}` defaults to {p.default!r}, torchcomms requires it")
        elif p.default is REQUIRED or p.default != default:
            out.append(f"{name}: `{pname}` defaults to {p.default!r}, torchcomms' to {default!r}")
    for p in params[len(want):]:
        if p.kind is not p.KEYWORD_ONLY:
            out.append(f"{name}: ferrocomm's extra `{p.name}` is {p.kind.description}, not "
                       "keyword-only after torchcomms' parameters")
    return out


def surface(cls_name, cls, table):
    bad, absent = [], []
    for name, want in table.items():
        fn = getattr(cls, name, None)
        if fn is None:
            absent.append(name)
            continue
        bad += differences(f"{cls_name}.{name}", fn, want)
    for name in PROPERTIES[cls_name]:
        member = inspect.getattr_static(cls, name, None)
        if member is None:
            absent.append(name)
        elif not isinstance(member, property):
            bad.append(f"{cls_name}.{name} is not a property")
    return bad, absent


@pytest.mark.parametrize("cls_name, cls, table", [
    ("TorchComm", ferrocomm.TorchComm, TORCH_COMM),
    ("TorchCommWindow", ferrocomm.TorchCommWindow, TORCH_COMM_WINDOW),
])
def test_every_method_has_torchcomms_signature(cls_name, cls, table):
    bad, absent = surface(cls_name, cls, table)
    assert not bad, "\n".join(bad)
    unlisted = sorted(set(absent) - set(LACKING[cls_name]))
    assert not unlisted, f"{cls_name} lacks {unlisted}, which LACKING does not list"


def test_new_comm_has_torchcomms_signature():
    bad = differences("new_comm", ferrocomm.new_comm, NEW_COMM, skip_self=False)
    assert not bad, "\n".join(bad)


def test_the_comparison_finds_each_kind_of_difference():
    """The checks above can fail: a renamed, reordered, defaulted or positional extra is
    reported."""
    def ok(self, tensor, dst, async_op, hints=None, timeout=None, *, mine=1):
        pass

    def renamed(self, t, dst, async_op, hints=None, timeout=None):
        pass

    def reordered(self, dst, tensor, async_op, hints=None, timeout=None):
        pass

    def extra_positional(self, tensor, dst, async_op, hints=None, timeout=None, mine=1):
        pass

    def defaulted(self, tensor, dst=0, async_op=False, hints=None, timeout=None):
        pass

    def short(self, tensor, dst, async_op, hints=None):
        pass

    want = coll("tensor", "dst")
    assert differences("ok", ok, want) == []
    assert "parameter 0 is `t`" in differences("f", renamed, want)[0]
    assert len(differences("f", reordered, want)) == 2
    assert "keyword-only" in differences("f", extra_positional, want)[0]
    assert differences("f", defaulted, want) == ["f: `dst` defaults to 0, torchcomms requires it"]
    assert differences("f", short, want) == ["f: lacks parameter 4 `timeout`"]


def test_positional_timeout_and_old_forms(tmp_path):
    """timeout after hints, positionally too; the keyword split sizes of all_to_all_single
    still take; its former positional split sizes are refused naming all_to_all_v_single."""
    import numpy as np
    from filestore import FileStore

    comm = ferrocomm.new_comm("host", "cpu", "sig", rank=0, size=1, store=FileStore(tmp_path))
    x = np.ones(4, np.float32)
    comm.all_reduce(x, ferrocomm.ReduceOp.SUM, False, None, 5.0)
    comm.broadcast(x, 0, False, None, 5.0)
    comm.barrier(False, None, 5.0)
    with pytest.raises(ferrocomm.FerrocommValueError, match="timeout must be positive"):
        comm.broadcast(x, 0, False, None, -1.0)
    out = np.zeros(4, np.float32)
    comm.all_to_all_single(out, x, output_split_sizes=[4], input_split_sizes=[4])
    np.testing.assert_array_equal(out, x)
    out[:] = 0
    comm.all_to_all_v_single(out, x, [4], [4], False, None, 5.0)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ferrocomm.FerrocommValueError, match="all_to_all_v_single"):
        comm.all_to_all_single(out, x, [4], [4])
    with pytest.raises(ferrocomm.FerrocommUnsupported, match="reconfigure"):
        ferrocomm.new_comm("host", "cpu", "sig2", enable_reconfigure=True, rank=0, size=1,
                           store=FileStore(tmp_path))
    assert comm.is_abort_supported()
    comm.finalize()


DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def section(title):
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    assert m, f"docs/python.md has no section '{title}'"
    return m.group(1)


def test_the_docs_list_what_ferrocomm_lacks():
    text = section("What torchcomms has that ferrocomm lacks")
    for cls_name, names in LACKING.items():
        for n in names:
            assert f"`{n}" in text, f"docs/python.md does not list {cls_name}.{n}"
    assert "59426ba4bfee75800b2909274d200401c4d5d2df" in DOC.read_text(encoding="utf-8")


def test_the_docs_list_every_difference():
    text = section("Differences from torchcomms' signatures")
    for pname, default in EXTRA_DEFAULTS.items():
        assert f"`{pname}`" in text, pname
    for needle in ("`peer_rank`", "`is_high_priority_stream`", "`name`",
                   "`output_split_sizes`", "`high_priority_stream`", "keyword-only"):
        assert needle in text, needle

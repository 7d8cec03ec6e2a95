"""GPU check of the "ferrocomm" torch.distributed backend, gloo on CPU copies as the reference.

    FERROCOMM_NCCL_LIB=/nonexistent torchrun --nproc_per_node 2 \\
        python/tests/gpu/check_torch_backend.py OUTDIR

Runs on one GPU (the ranks share it; NCCL must be off, as it refuses two ranks on one GPU) or
on one GPU per rank. Checks, each reported pass/fail with its numbers:
  1. every c10d collective, the object and functional collectives and torch.compile (inductor)
     on CUDA tensors against gloo (the CI scenario of python/tests/torch_ranks.py), and
     all_gather_coalesced (sync and async) and sparse all_reduce (its gaps scenario); async
     work (futures, a side stream, 150 direct-API works in flight); a call's own timeout
     reaching the direct-access kernel;
  2. CUDA graph capture of dist.all_reduce and 200 replays with fresh data;
  3. torch.compile(fullgraph=True) of a function with a functional all-reduce (inductor);
  4. a DTensor tensor-parallel MLP (ColwiseParallel / RowwiseParallel) equal to the
     single-process model;
  5. a transformers Llama (random weights from a config, saved under OUTDIR) loaded with
     tp_plan="auto": logits against the single-GPU model within bf16 tolerance, with and
     without E4M3 low precision (the errors are reported).
Writes OUTDIR/torch_backend.rankR.json and prints a summary; exits 1 on any failure.
"""

import datetime
import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
os.environ.setdefault("FERROCOMM_TEST_DEVICE", "cuda")
os.environ.setdefault("FERROCOMM_TEST_COMPILE", "inductor")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as fc  # noqa: E402

import ferrocomm  # noqa: E402
import ferrocomm.torch as fct  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch_ranks  # noqa: E402

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("torch_backend_out")
DEV = torch.device("cuda", LOCAL % torch.cuda.device_count())
RESULTS = []
faulthandler.dump_traceback_later(int(os.environ.get("CHECK_WATCHDOG_S", "540")), exit=True)


def log(msg):
    if RANK == 0:
        print(msg, flush=True)


def check(name, fn):
    """Runs one check on every rank; it passes where every rank passed."""
    detail, ok = {}, True
    try:
        detail = fn() or {}
    except Exception:  # noqa: BLE001 (reported)
        ok = False
        detail = {"error": traceback.format_exc()[-2000:]}
        print(f"rank {RANK}: {name} failed:\n{detail['error']}", flush=True)
    RESULTS.append({"check": name, "rank": RANK, "ok": ok, **detail})
    log(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(detail)[:300]}")
    return ok


def init():
    dist.init_process_group("ferrocomm", timeout=datetime.timedelta(seconds=120))
    torch_ranks.GLOO = dist.new_group(backend="gloo")
    return torch_ranks.GLOO


def gloo_sum(cpu, gloo):
    y = cpu.clone()
    dist.all_reduce(y, group=gloo)
    return y


def async_work(gloo):
    cpu = [torch.randn(513, generator=torch.Generator().manual_seed(k + 9 * RANK))
           for k in range(4)]
    xs = [c.to(DEV) for c in cpu]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    fut = works[0].get_future()
    for w in reversed(works):
        w.wait()
    got = [x.cpu() for x in xs]  # the current stream waited on the work
    for c, g in zip(cpu, got):
        assert (g - gloo_sum(c, gloo)).abs().max().item() < 1e-4
    assert all(w.is_completed() for w in works)
    assert torch.equal(fut.wait()[0].cpu(), got[0])
    # Issued on a side stream, waited on the current one: wait() orders the current stream.
    side = torch.cuda.Stream()
    y = xs[1].clone()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w = dist.all_reduce(y, async_op=True)
    w.wait()
    assert (y.cpu() - gloo_sum(got[1], gloo)).abs().max().item() < 1e-3
    return {}


def many_in_flight(gloo):
    """The group's communicator directly (torchcomms' API): more async works alive at once than
    the native layer keeps events for, waited in reverse with a bounded blocking wait, polled,
    dropped, and their events reused by the next calls."""
    comm = dist.group.WORLD.comm(DEV)
    cpu = [torch.randn(4099, generator=torch.Generator().manual_seed(100 + k + 7 * RANK))
           for k in range(150)]
    xs = [c.to(DEV) for c in cpu]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    for w in reversed(works):
        w.wait_blocking(timeout=60)
    assert all(w.is_completed() for w in works)
    del works
    ys = [c.to(DEV) for c in cpu]
    for y in ys:
        comm.all_reduce(y, async_op=True).wait()
    err = 0.0
    for c, x, y in zip(cpu, xs, ys):
        ref = gloo_sum(c, gloo)
        err = max(err, (x.cpu() - ref).abs().max().item(), (y.cpu() - ref).abs().max().item())
    assert err < 1e-4, err
    return {"works": 300, "max_abs_err": err}


def kernel_call_timeout(gloo):
    """A call's own timeout reaches the direct-access kernel: on a communicator whose timeout
    is 120 s, rank 0 all-reduces alone with timeout=2; its kernel gives up after ~2 s (the GPU
    is free again) and the next call reports the timeout, naming rank 1 and the 2 s. Rank 1
    keeps its communicator (the memory rank 0's kernel reads) until rank 0 is done."""
    store = dist.distributed_c10d._get_default_store()
    comm = ferrocomm.new_comm("ferrocomm", DEV, "kernel-timeout", store=store, timeout=120,
                              rank=RANK, size=WORLD)
    detail = {}
    try:
        if RANK == 0:
            x = torch.ones(1024, device=DEV)
            t0 = time.monotonic()
            comm.all_reduce(x, timeout=2)
            torch.cuda.synchronize()
            took = time.monotonic() - t0
            try:
                comm.all_reduce(x)
                msg = "no timeout reported"
            except ferrocomm.FerrocommTimeout as e:
                msg = str(e)
            detail = {"kernel_gave_up_after_s": round(took, 2), "error": msg[:160]}
            assert 1.5 < took < 30, detail
            assert "waiting for rank 1" in msg and "2s" in msg, detail
            assert comm.is_aborted()
    finally:
        # Also when rank 0 fails: the ranks' gloo calls stay paired.
        dist.barrier(group=gloo)
        comm.finalize()
    return detail


def graph_capture(gloo):
    x = torch.zeros(4099, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up outside the capture (creates the communicator)
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
        y = x * 2
    worst = 0.0
    for i in range(200):
        g = torch.Generator().manual_seed(1000 * i + RANK)
        fresh = torch.randn(4099, generator=g)
        x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        want = gloo_sum(fresh, gloo)
        err = (y.cpu() - 2 * want).abs().max().item()
        worst = max(worst, err)
        assert err < 1e-4, f"replay {i}: max error {err}"
    return {"replays": 200, "max_abs_error": worst}


def compiled_functional(gloo):
    group = dist.group.WORLD

    def f(t):
        return torch.relu(fc.all_reduce(t * 2 + 1, "sum", group)) - 1

    cf = torch.compile(f, fullgraph=True)
    worst = 0.0
    for i in range(3):
        cpu = torch.randn(1000, generator=torch.Generator().manual_seed(77 + i + 10 * RANK))
        got = cf(cpu.to(DEV)).cpu()
        want = torch.relu(gloo_sum(cpu * 2 + 1, gloo)) - 1
        err = (got - want).abs().max().item()
        worst = max(worst, err)
        assert err < 1e-4, f"call {i}: max error {err}"
    return {"max_abs_error": worst}


def dtensor_mlp(_gloo):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).to(DEV)
    inp = torch.randn(8, 64, generator=torch.Generator().manual_seed(5)).to(DEV)
    want = model(inp).detach()
    mesh = init_device_mesh("cuda", (WORLD,))
    tp = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    got = tp(inp).detach()
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"TP MLP differs from the single-process model by {err}"
    return {"max_abs_error": err}


def llama_tp(gloo):
    from transformers import AutoModelForCausalLM, LlamaConfig

    path = OUT / "llama-random"
    if RANK == 0 and not (path / "config.json").exists():
        cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                          num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                          max_position_embeddings=256)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).save_pretrained(path)
    dist.barrier()
    ids = torch.randint(0, 1024, (2, 48), generator=torch.Generator().manual_seed(3)).to(DEV)
    single = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).to(DEV)
    with torch.no_grad():
        want = single(ids).logits.float()
    del single
    # transformers sets the device from LOCAL_RANK: ranks sharing a GPU name the one they use.
    os.environ["LOCAL_RANK"] = str(DEV.index)
    tp = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, tp_plan="auto")
    out = {}
    for label, hints in (("full", {}), ("e4m3", {"low_precision": "e4m3"})):
        with torch.no_grad(), fct.hints(**hints):
            got = tp(ids).logits
        got = (got.full_tensor() if hasattr(got, "full_tensor") else got).float()
        diff = (got - want).abs()
        rel = (diff.norm() / want.norm()).item()
        out[label] = {"max_abs_error": diff.max().item(), "rel_error": rel,
                      "logit_scale": want.abs().max().item()}
        # bf16 carries 8 bits: sums in another order differ by a few ulps of the logits.
        bound = 0.03 if label == "full" else 0.15
        assert rel < bound, f"{label}: relative logit error {rel:.4f} >= {bound}"
    del gloo
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.cuda.set_device(DEV)
    log(f"{WORLD} ranks on {torch.cuda.device_count()} GPU(s), torch {torch.__version__}")
    gloo = init()
    check("collectives vs gloo (torch_ranks collectives on CUDA)", torch_ranks.collectives)
    check("all_gather_coalesced (sync, async) vs gloo on CUDA",
          torch_ranks.coalesced_all_gather)
    check("sparse all_reduce vs gloo on CUDA", torch_ranks.sparse_all_reduce)
    check("async work on CUDA", lambda: async_work(gloo))
    check("150 async works in flight (direct API)", lambda: many_in_flight(gloo))
    check("a call's timeout reaches the kernel", lambda: kernel_call_timeout(gloo))
    check("CUDA graph capture + 200 replays", lambda: graph_capture(gloo))
    check("torch.compile(fullgraph=True) functional all_reduce",
          lambda: compiled_functional(gloo))
    check("DTensor TP MLP", lambda: dtensor_mlp(gloo))
    check("transformers Llama tp_plan=auto", lambda: llama_tp(gloo))
    dist.barrier(group=gloo)
    ok = [r["ok"] for r in RESULTS]
    flags = torch.tensor([int(all(ok))])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=gloo)
    (OUT / f"torch_backend.rank{RANK}.json").write_text(json.dumps(RESULTS, indent=2))
    dist.destroy_process_group()
    log(f"{sum(ok)}/{len(ok)} checks passed on rank {RANK}; all ranks: "
        f"{'PASS' if flags.item() else 'FAIL'}")
    sys.exit(0 if flags.item() else 1)


if __name__ == "__main__":
    main()

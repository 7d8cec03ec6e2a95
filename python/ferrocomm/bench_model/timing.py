"""Decode (time per output token, one CUDA graph per step) and prefill (time to first token)."""

import statistics
import time

import torch


class _Clock:
    """Per-call times in ms: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def run(self, fn, n):
        if not self.cuda:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def decode(model, reducer, group, batch, context, steps, warmup, seed):
    """Median ms of one decode step (batch sequences, one new token each, attending to a cache
    of `context` positions), the step captured in one CUDA graph where the path allows it."""
    dev = model.device
    cache = model.new_cache(batch, context)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, model.cfg.vocab, (batch, 1), generator=gen).to(dev)
    pos = torch.tensor([context - 1], device=dev)

    def step():
        return model.forward(tokens, reducer, cache=cache, positions=pos)

    use_graph = torch.device(dev).type == "cuda" and reducer.graphable
    if use_graph:
        # Warm up on a side stream (as torch's graph capture wants), then capture one step.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        group.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    else:
        run = step
    for _ in range(warmup):
        run()
    _sync(dev)
    group.barrier()
    times = _Clock(dev).run(run, steps)
    med = statistics.median(times)
    return {"batch": batch, "context": context, "steps": steps, "graph": use_graph,
            "tpot_ms": group.max(med), "tpot_ms_rank": med}


def prefill(model, reducer, group, length, reps, seed):
    """Median ms from a prompt of `length` tokens (batch 1) to its first token on the host."""
    dev = model.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, model.cfg.vocab, (1, length), generator=gen).to(dev)
    cache = model.new_cache(1, length)

    def once():
        logits = model.forward(tokens, reducer, cache=cache)
        return int(logits.argmax(-1)[0].item())  # the host has the token: time to first token

    once()
    group.barrier()
    times = []
    for _ in range(reps):
        group.barrier()
        t0 = time.perf_counter()
        once()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    return {"prompt": length, "reps": reps, "ttft_ms": group.max(med), "ttft_ms_rank": med}


def run(model, group, paths, args):
    """Every decode batch and prefill length on every path, plus the no-communication step."""
    results = {"decode": [], "prefill": []}
    names = list(paths) + (["none"] if args.comm_share else [])
    for name in names:
        reducer = group.reducer(name, lp=args.lp_format, algo=args.algo,
                                lp_min_bytes=args.lp_min_bytes)
        for b in args.decode_batches:
            r = decode(model, reducer, group, b, args.context, args.steps, args.warmup, args.seed)
            results["decode"].append({"path": name, **r})
            _cleanup(model.device)
        for n in args.prefill:
            r = prefill(model, reducer, group, n, args.prefill_reps, args.seed)
            results["prefill"].append({"path": name, **r})
            _cleanup(model.device)
    if args.comm_share:
        base = {r["batch"]: r["tpot_ms"] for r in results["decode"] if r["path"] == "none"}
        for r in results["decode"]:
            if r["path"] != "none" and r["tpot_ms"] > 0:
                r["comm_share"] = max(0.0, 1.0 - base[r["batch"]] / r["tpot_ms"])
        pbase = {r["prompt"]: r["ttft_ms"] for r in results["prefill"] if r["path"] == "none"}
        for r in results["prefill"]:
            if r["path"] != "none" and r["ttft_ms"] > 0:
                r["comm_share"] = max(0.0, 1.0 - pbase[r["prompt"]] / r["ttft_ms"])
    return results


def _cleanup(device):
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()

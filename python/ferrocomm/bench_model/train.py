"""The small byte-level language model --fidelity trains on text every Python has offline: the
standard library's own source."""

import math
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import Model
from .paths import Reducer

# One file in HELD_OUT_EVERY (by a hash of its path) is held out for evaluation.
HELD_OUT_EVERY = 16


def stdlib_corpus(limit_bytes):
    """(train bytes, held-out bytes) of the standard library's .py files, read in sorted order
    up to `limit_bytes`, split by file so the held-out text was never seen in training."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    if not files:
        raise RuntimeError(f"no Python source under {root} to train on")
    train, held, total = [], [], 0
    for p in files:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        rel = p.relative_to(root).as_posix().encode()
        (held if zlib.crc32(rel) % HELD_OUT_EVERY == 0 else train).append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    return b"".join(train), b"".join(held), str(root)


def as_tokens(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def train(cfg, data, *, steps, batch, seq, lr, seed, device, log=print):
    """Trains `cfg` from `seed` on the token tensor `data`; returns (full weights, stats)."""
    torch.manual_seed(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    cuda = torch.device(device).type == "cuda"
    model = Model.random(cfg, seed, 0, 1, device, torch.float32, max_pos=seq)
    # Smaller initial scale for training (the bench's random weights are unit-scaled).
    params = []
    for lay in model.layers:
        for k, t in lay.items():
            if not k.endswith("norm"):
                t.mul_(0.5)
    model.embed.mul_(0.02)
    for lay in model.layers:
        for t in lay.values():
            t.requires_grad_(True)
            params.append(t)
    for t in (model.embed, model.final_norm, model.lm_head):
        t.requires_grad_(True)
        params.append(t)
    decay = [p for p in params if p.dim() == 2]
    other = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=cuda)
    warm = max(1, steps // 20)

    def lr_at(i):
        if i < warm:
            return lr * (i + 1) / warm
        p = (i - warm) / max(1, steps - warm)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    data = data.to(device)
    if data.numel() <= seq + 1:
        raise RuntimeError(f"training text of {data.numel()} tokens is shorter than a sequence")
    reducer = Reducer()
    t0 = time.perf_counter()
    losses = []
    for i in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(i)
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen, device=device)
        idx = starts[:, None] + torch.arange(seq + 1, device=device)
        chunk = data[idx]
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                            enabled=cuda):
            logits = model.forward(chunk[:, :-1], reducer, all_logits=True)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if i % 100 == 0 or i + 1 == steps:
            losses.append((i, float(loss.item())))
            log(f"train step {i}/{steps}: loss {losses[-1][1]:.3f} nats/byte "
                f"({time.perf_counter() - t0:.1f} s)")
    stats = {"steps": steps, "batch": batch, "seq": seq, "lr": lr, "seed": seed,
             "params": cfg.params(), "seconds": time.perf_counter() - t0,
             "final_loss": losses[-1][1], "losses": losses}
    with torch.no_grad():
        full = {k: (v.detach().cpu() if torch.is_tensor(v) else
                    [{n: t.detach().cpu() for n, t in lay.items()} for lay in v])
                for k, v in model.full_weights().items()}
    return full, stats


"""The tensor-parallel Llama-architecture decoder in plain PyTorch.

Weights come in two layouts. The *full* layout is the model's own (one tensor per projection,
as a Hugging Face checkpoint stores them). A rank's *shard* keeps its slice of the heads and of
the MLP, fused the way engines run them: ``wqkv`` (this rank's query heads, then its key and
value heads) and ``wgu`` (gate then up, column parallel), ``wo`` and ``w_down`` row parallel.
A layer's attention and its MLP each end in one all-reduce of a partial sum over the hidden
size, followed by the residual add and the next RMSNorm: ``Reducer.add_norm`` does these three
steps, so a fused all-reduce + residual + RMSNorm replaces exactly them. The output head is
split by vocabulary rows (padded to a multiple of the world size) and the logits gathered
(``Reducer.all_gather``); the embedding and the final norm are replicated on every rank.
"""

import math

import torch
import torch.nn.functional as F

_FULL_KEYS = ("in_norm", "wq", "wk", "wv", "wo", "post_norm", "w_gate", "w_up", "w_down")


def rmsnorm(x, weight, eps):
    """RMSNorm as Llama computes it: in float32, back to the input dtype, times the weight."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


def _random_layer(cfg, gen, device):
    """One layer's full weights, drawn in a fixed order from `gen` (float32)."""
    h, hd = cfg.hidden, cfg.head_dim

    def lin(rows, cols):
        return torch.randn(rows, cols, generator=gen, device=device) / math.sqrt(cols)

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen, device=device)

    layer = {
        "in_norm": norm(h),
        "wq": lin(cfg.heads * hd, h),
        "wk": lin(cfg.kv_heads * hd, h),
        "wv": lin(cfg.kv_heads * hd, h),
        "wo": lin(h, cfg.heads * hd),
        "post_norm": norm(h),
        "w_gate": lin(cfg.ffn, h),
        "w_up": lin(cfg.ffn, h),
        "w_down": lin(h, cfg.ffn),
    }
    if cfg.qk_norm:
        layer["q_norm"] = norm(hd)
        layer["k_norm"] = norm(hd)
    return layer


def shard_layer(cfg, layer, rank, world, dtype):
    """A rank's shard of one full-layout layer (see the module's doc)."""
    hd = cfg.head_dim
    nq, nk, f = cfg.heads // world, cfg.kv_heads // world, cfg.ffn // world
    q = layer["wq"][rank * nq * hd:(rank + 1) * nq * hd]
    k = layer["wk"][rank * nk * hd:(rank + 1) * nk * hd]
    v = layer["wv"][rank * nk * hd:(rank + 1) * nk * hd]
    out = {
        "in_norm": layer["in_norm"],
        "wqkv": torch.cat([q, k, v]),
        "wo": layer["wo"][:, rank * nq * hd:(rank + 1) * nq * hd],
        "post_norm": layer["post_norm"],
        "wgu": torch.cat([layer["w_gate"][rank * f:(rank + 1) * f],
                          layer["w_up"][rank * f:(rank + 1) * f]]),
        "w_down": layer["w_down"][:, rank * f:(rank + 1) * f],
    }
    if cfg.qk_norm:
        out["q_norm"] = layer["q_norm"]
        out["k_norm"] = layer["k_norm"]
    return {k: t.to(dtype).contiguous() for k, t in out.items()}


def shard_head(lm_head, rank, world, dtype):
    """A rank's rows of the output head [vocab, hidden], zero-padded to equal parts."""
    part = -(-lm_head.shape[0] // world)
    rows = lm_head[rank * part:(rank + 1) * part]
    if rows.shape[0] < part:
        rows = torch.cat([rows, rows.new_zeros(part - rows.shape[0], rows.shape[1])])
    return rows.to(dtype).contiguous()


def unshard_layer(cfg, shard):
    """The full layout of a one-rank shard (its inverse at world size 1)."""
    hd = cfg.head_dim
    q, k, v = shard["wqkv"].split([cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * hd])
    gate, up = shard["wgu"].split([cfg.ffn, cfg.ffn])
    out = {"in_norm": shard["in_norm"], "wq": q, "wk": k, "wv": v, "wo": shard["wo"],
           "post_norm": shard["post_norm"], "w_gate": gate, "w_up": up,
           "w_down": shard["w_down"]}
    for key in ("q_norm", "k_norm"):
        if key in shard:
            out[key] = shard[key]
    return out


class Model:
    """One rank's part of the model: its shards, the replicated embedding and head, RoPE tables."""

    def __init__(self, cfg, rank, world, layers, embed, final_norm, lm_head, device, dtype,
                 max_pos=8192):
        cfg.check_split(world)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.layers, self.embed, self.final_norm, self.lm_head = layers, embed, final_norm, lm_head
        self.device, self.dtype = device, dtype
        self.nq, self.nk = cfg.heads // world, cfg.kv_heads // world
        self.set_max_pos(max_pos)

    def set_max_pos(self, max_pos):
        """(Re)builds the RoPE tables for positions below `max_pos`."""
        cfg = self.cfg
        inv = 1.0 / (cfg.rope_theta ** (
            torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        if cfg.rope_llama3:
            inv = _llama3_scaling(inv, *cfg.rope_llama3)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(self.device, torch.float32)
        self.sin = emb.sin().to(self.device, torch.float32)
        self.max_pos = max_pos

    @classmethod
    def random(cls, cfg, seed, rank, world, device, dtype, max_pos=8192):
        """Weights drawn from `seed` on `device`: every rank draws the same full tensors and
        keeps its slice, so a model at any world size is the same model."""
        cfg.check_split(world)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        embed = torch.randn(cfg.vocab, cfg.hidden, generator=gen, device=device).to(dtype)
        layers = [shard_layer(cfg, _random_layer(cfg, gen, device), rank, world, dtype)
                  for _ in range(cfg.layers)]
        final_norm = (1.0 + 0.1 * torch.randn(cfg.hidden, generator=gen, device=device)).to(dtype)
        lm_head = shard_head(torch.randn(cfg.vocab, cfg.hidden, generator=gen, device=device)
                             / math.sqrt(cfg.hidden), rank, world, dtype)
        return cls(cfg, rank, world, layers, embed, final_norm, lm_head, device, dtype, max_pos)

    @classmethod
    def from_full(cls, cfg, full, rank, world, device, dtype, max_pos=8192):
        """A rank's model from full-layout weights (a dict: embed, layers, final_norm, lm_head)."""
        cfg.check_split(world)

        def dev(t):
            return t.to(device, dtype).contiguous()

        layers = [shard_layer(cfg, {k: t.to(device) for k, t in lay.items()}, rank, world, dtype)
                  for lay in full["layers"]]
        return cls(cfg, rank, world, layers, dev(full["embed"]), dev(full["final_norm"]),
                   shard_head(full["lm_head"].to(device), rank, world, dtype), device, dtype,
                   max_pos)

    def new_cache(self, batch, max_len):
        return KVCache(self, batch, max_len)

    def forward(self, tokens, reducer, *, cache=None, positions=None, all_logits=False):
        """Logits (float32) for `tokens` [batch, T]: of the last position, or of every position
        with `all_logits`.

        Without `cache`, or with `positions` None, the tokens are a prompt starting at position
        0 (causal attention among them; written into `cache` when given). With `positions` (a
        long tensor of one element on the device, the position of the single new token), the
        token attends to the cache up to that position: a decode step, capturable in a CUDA
        graph since nothing depends on host values.
        """
        cfg = self.cfg
        b, t = tokens.shape
        hd = cfg.head_dim
        if positions is None:
            if t > self.max_pos:
                raise ValueError(f"prompt of {t} tokens is longer than the RoPE table "
                                 f"({self.max_pos}); build the model with a larger max_pos")
            cos, sin = self.cos[:t], self.sin[:t]
            mask = None
        else:
            if t != 1:
                raise ValueError("a decode step takes one token per sequence")
            cos, sin = self.cos[positions], self.sin[positions]
            mask = (torch.arange(cache.max_len, device=tokens.device) <= positions)[None]
        h = self.embed[tokens]
        x = rmsnorm(h, self.layers[0]["in_norm"], cfg.eps)
        for i, lay in enumerate(self.layers):
            qkv = x @ lay["wqkv"].t()
            q, k, v = qkv.split([self.nq * hd, self.nk * hd, self.nk * hd], dim=-1)
            q = q.view(b, t, self.nq, hd).transpose(1, 2)
            k = k.view(b, t, self.nk, hd).transpose(1, 2)
            v = v.view(b, t, self.nk, hd).transpose(1, 2)
            if cfg.qk_norm:
                q = rmsnorm(q, lay["q_norm"], cfg.eps)
                k = rmsnorm(k, lay["k_norm"], cfg.eps)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            if mask is None:
                if cache is not None:
                    cache.k[i][:, :, :t] = k
                    cache.v[i][:, :, :t] = v
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                   enable_gqa=self.nq != self.nk)
            else:
                cache.k[i].index_copy_(2, positions, k)
                cache.v[i].index_copy_(2, positions, v)
                a = F.scaled_dot_product_attention(q, cache.k[i], cache.v[i], attn_mask=mask,
                                                   enable_gqa=self.nq != self.nk)
            o = a.transpose(1, 2).reshape(b, t, self.nq * hd) @ lay["wo"].t()
            x, h = reducer.add_norm(o, h, lay["post_norm"], cfg.eps)
            gate, up = (x @ lay["wgu"].t()).chunk(2, dim=-1)
            d = (F.silu(gate) * up) @ lay["w_down"].t()
            last = i + 1 == len(self.layers)
            nxt = self.final_norm if last else self.layers[i + 1]["in_norm"]
            x, h = reducer.add_norm(d, h, nxt, cfg.eps)
        if not all_logits:
            x = x[:, -1]
        logits = x @ self.lm_head.t()
        if self.world > 1:
            parts = torch.empty((self.world, *logits.shape), dtype=logits.dtype,
                                device=logits.device)
            reducer.all_gather(parts, logits.contiguous())
            logits = parts.movedim(0, -2).reshape(*logits.shape[:-1], -1)
        return logits[..., :cfg.vocab].float()

    def full_weights(self):
        """Full-layout weights of a one-rank model (for saving a trained model)."""
        if self.world != 1:
            raise ValueError("full_weights needs the one-rank model")
        return {"embed": self.embed, "final_norm": self.final_norm, "lm_head": self.lm_head,
                "layers": [unshard_layer(self.cfg, lay) for lay in self.layers]}


class KVCache:
    """Keys and values of every layer for `batch` sequences of up to `max_len` tokens."""

    def __init__(self, model, batch, max_len):
        if max_len > model.max_pos:
            model.set_max_pos(max_len)
        shape = (batch, model.nk, max_len, model.cfg.head_dim)
        self.k = [torch.zeros(shape, device=model.device, dtype=model.dtype)
                  for _ in model.layers]
        self.v = [torch.zeros(shape, device=model.device, dtype=model.dtype)
                  for _ in model.layers]
        self.max_len = max_len


def _rope(x, cos, sin):
    """Rotary embedding in Llama's layout (the two halves of a head rotate together)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


def _llama3_scaling(inv, factor, low_freq_factor, high_freq_factor, original_max):
    """Llama 3.1's RoPE frequency scaling (as transformers' `_compute_llama3_parameters`)."""
    low_wavelen = original_max / low_freq_factor
    high_wavelen = original_max / high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)

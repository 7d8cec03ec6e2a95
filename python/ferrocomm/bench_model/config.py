"""Model shapes: the named sizes, flag overrides, and a Hugging Face config.json."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


class BenchArgumentError(ValueError):
    """A bad argument to the model bench (size, path, shape that does not split, ...)."""


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-architecture decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float = 500000.0
    eps: float = 1e-5
    # Qwen3 normalizes every query and key head (RMSNorm over head_dim) before RoPE.
    qk_norm: bool = False
    # Llama 3.1's frequency scaling: (factor, low_freq_factor, high_freq_factor, original_max).
    rope_llama3: tuple = None

    def params(self):
        """Number of parameters (embedding and output head counted separately)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.ffn
        per_layer = attn + mlp + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden

    def check_split(self, world):
        """Raises BenchArgumentError unless the heads, KV heads and MLP split over `world` ranks."""
        for what, n in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if n % world:
                raise BenchArgumentError(
                    f"model {self.name}: {what}={n} does not split over {world} ranks "
                    f"(tensor parallelism needs {what} divisible by the world size)")
        if self.heads % self.kv_heads:
            raise BenchArgumentError(
                f"model {self.name}: heads={self.heads} is not a multiple of "
                f"kv_heads={self.kv_heads}")


SIZES = {
    # Layer shapes of the published models; the layer count is the full model's (--layers cuts it).
    "llama3-8b": ModelConfig("llama3-8b", vocab=128256, hidden=4096, layers=32, heads=32,
                             kv_heads=8, head_dim=128, ffn=14336),
    "llama3-70b": ModelConfig("llama3-70b", vocab=128256, hidden=8192, layers=80, heads=64,
                              kv_heads=8, head_dim=128, ffn=28672),
    "qwen3-8b": ModelConfig("qwen3-8b", vocab=151936, hidden=4096, layers=36, heads=32,
                            kv_heads=8, head_dim=128, ffn=12288, rope_theta=1e6, eps=1e-6,
                            qk_norm=True),
    # The small model --fidelity trains on bytes (about 25M parameters).
    "byte-lm": ModelConfig("byte-lm", vocab=256, hidden=512, layers=8, heads=8, kv_heads=4,
                           head_dim=64, ffn=1536, rope_theta=10000.0),
    # For tests on the CPU.
    "tiny": ModelConfig("tiny", vocab=256, hidden=64, layers=2, heads=4, kv_heads=2,
                        head_dim=16, ffn=128, rope_theta=10000.0),
    "tiny-qk": ModelConfig("tiny-qk", vocab=256, hidden=64, layers=2, heads=4, kv_heads=2,
                           head_dim=16, ffn=128, rope_theta=10000.0, eps=1e-6, qk_norm=True),
}

_OVERRIDES = ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn")


def resolve(name, **overrides):
    """The named size with the given fields replaced (None leaves a field as it is)."""
    if name not in SIZES:
        raise BenchArgumentError(
            f"unknown model size {name!r}; known: {', '.join(sorted(SIZES))} "
            "(or --hf DIR for a Hugging Face model)")
    changes = {}
    for k, v in overrides.items():
        if k not in _OVERRIDES:
            raise BenchArgumentError(f"unknown model field {k!r}")
        if v is None:
            continue
        if not isinstance(v, int) or v <= 0:
            flag = "--" + k.replace("_", "-")
            raise BenchArgumentError(f"{flag} must be a positive integer, not {v!r}")
        changes[k] = v
    cfg = dataclasses.replace(SIZES[name], **changes)
    if changes:
        cfg = dataclasses.replace(cfg, name=name + "+" + ",".join(
            f"{k}={v}" for k, v in sorted(changes.items())))
    return cfg


def from_hf(directory):
    """ModelConfig from a Hugging Face model directory's config.json (Llama, Mistral, Qwen3)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise BenchArgumentError(f"--hf {directory}: no config.json there")
    c = json.loads(path.read_text())
    kind = c.get("model_type", "")
    if kind not in ("llama", "mistral", "qwen3"):
        raise BenchArgumentError(
            f"--hf {directory}: model_type {kind!r} is not a Llama-architecture model the bench "
            "knows (llama, mistral, qwen3)")
    if c.get("attention_bias") or c.get("mlp_bias"):
        raise BenchArgumentError(f"--hf {directory}: biases in attention or MLP are not supported")
    heads = c["num_attention_heads"]
    # transformers 5 keeps theta and scaling in "rope_parameters"; 4.x in rope_theta/rope_scaling.
    scaling = c.get("rope_parameters") or c.get("rope_scaling") or {}
    theta = c.get("rope_theta", scaling.get("rope_theta", 10000.0))
    kind_scaling = scaling.get("rope_type", scaling.get("type", "default"))
    llama3 = None
    if kind_scaling == "llama3":
        llama3 = (float(scaling["factor"]), float(scaling["low_freq_factor"]),
                  float(scaling["high_freq_factor"]),
                  float(scaling["original_max_position_embeddings"]))
    elif kind_scaling not in ("default", None):
        raise BenchArgumentError(
            f"--hf {directory}: rope scaling {kind_scaling!r} is not supported")
    return ModelConfig(
        name=Path(directory).name, vocab=c["vocab_size"], hidden=c["hidden_size"],
        layers=c["num_hidden_layers"], heads=heads,
        kv_heads=c.get("num_key_value_heads", heads),
        head_dim=c.get("head_dim") or c["hidden_size"] // heads, ffn=c["intermediate_size"],
        rope_theta=float(theta), eps=float(c.get("rms_norm_eps", 1e-6)),
        qk_norm=kind == "qwen3", rope_llama3=llama3)

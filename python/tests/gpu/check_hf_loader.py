"""The model bench's Hugging Face loader against transformers' own forward pass.

Builds small random Llama and Qwen3 models with transformers (no download), saves them, loads
them through `--hf`'s loader into the bench's model on one rank, and compares the logits of a
prompt. Exits non-zero on a mismatch. Usage: python check_hf_loader.py [OUT_DIR]
"""

import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ferrocomm.bench_model import config
from ferrocomm.bench_model import hf as hf_loader
from ferrocomm.bench_model.model import Model
from ferrocomm.bench_model.paths import Reducer


def case(name, cls, cfg, root, device):
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    d = Path(root) / name
    hf.save_pretrained(d)
    mc = config.from_hf(d)
    full = hf_loader.weights(d, torch.float32)
    ours = Model.from_full(mc, full, 0, 1, device, torch.float32, 64)
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.to(device)(ids.to(device)).logits.float()
        got = ours.forward(ids.to(device), Reducer(), all_logits=True)
    diff = (ref - got).abs().max().item()
    ok = diff <= 1e-3 * max(1.0, ref.abs().max().item())
    print(f"{name}: max |bench - transformers| = {diff:.3e} {'ok' if ok else 'MISMATCH'}")
    return {"model": name, "max_abs_diff": diff, "ok": ok}


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        rows.append(case("llama", LlamaForCausalLM, LlamaConfig(
            **small, rope_theta=500000.0, rms_norm_eps=1e-5), root, device))
        rows.append(case("llama3.1-rope", LlamaForCausalLM, LlamaConfig(
            **small, rope_theta=500000.0, rope_scaling={
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), root, device))
        rows.append(case("qwen3", Qwen3ForCausalLM, Qwen3Config(
            **small, head_dim=32, rope_theta=1e6, rms_norm_eps=1e-6), root, device))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "hf_loader.json").write_text(json.dumps(rows, indent=2) + "\n")
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()

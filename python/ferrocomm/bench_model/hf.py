"""A Hugging Face model directory as the bench's full-layout weights, and a text's tokens
(transformers, local files only: nothing is downloaded)."""

from pathlib import Path

from .config import BenchArgumentError


def _transformers():
    try:
        import transformers
    except ImportError:
        raise BenchArgumentError("--hf needs transformers (pip install transformers)")
    return transformers


def weights(directory, dtype):
    """Full-layout weights (embed, layers, final_norm, lm_head) of a Llama/Qwen3 checkpoint."""
    hf = _transformers().AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=dtype, local_files_only=True)
    sd = hf.state_dict()
    layers = []
    for i in range(hf.config.num_hidden_layers):
        p = f"model.layers.{i}."
        lay = {"in_norm": sd[p + "input_layernorm.weight"],
               "wq": sd[p + "self_attn.q_proj.weight"], "wk": sd[p + "self_attn.k_proj.weight"],
               "wv": sd[p + "self_attn.v_proj.weight"], "wo": sd[p + "self_attn.o_proj.weight"],
               "post_norm": sd[p + "post_attention_layernorm.weight"],
               "w_gate": sd[p + "mlp.gate_proj.weight"], "w_up": sd[p + "mlp.up_proj.weight"],
               "w_down": sd[p + "mlp.down_proj.weight"]}
        if p + "self_attn.q_norm.weight" in sd:
            lay["q_norm"] = sd[p + "self_attn.q_norm.weight"]
            lay["k_norm"] = sd[p + "self_attn.k_norm.weight"]
        layers.append(lay)
    embed = sd["model.embed_tokens.weight"]
    return {"embed": embed, "final_norm": sd["model.norm.weight"],
            "lm_head": sd.get("lm_head.weight", embed), "layers": layers}


def tokens(directory, text_file):
    """The token ids (1-D) of a text file under the directory's tokenizer."""
    tok = _transformers().AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return tok(Path(text_file).read_text(), return_tensors="pt")["input_ids"][0]

"""GGUF copies of the tiny fixtures, written with the ``gguf`` package the way llama.cpp's
``convert_hf_to_gguf.py`` converts each architecture: its tensor names
(``gguf.get_tensor_name_map``), its per-architecture metadata keys, q/k rows permuted for the
``llama`` architecture only (Mistral is written as ``llama``), Gemma's ``+1`` baked into every norm
weight, and LLaMA 3's RoPE scaling as ``rope_freqs.weight``; Gemma 3's ``query_pre_attn_scalar`` as ``gemma3.attention.scale``. Matrices are stored in BF16 (the
fixtures' own dtype, checked to round-trip exactly), vectors in F32, as llama.cpp keeps norms. The tokenizer is the
fixture's byte-level BPE as ``tokenizer.ggml.*`` (model ``gpt2``, pre-tokenizer ``default``).

Used by ``make_fixtures.py --arch``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

ARCHS = {
    # model_type: (GGUF architecture, permute q/k)
    "llama": (gguf.MODEL_ARCH.LLAMA, True),
    "mistral": (gguf.MODEL_ARCH.LLAMA, True),
    "qwen2": (gguf.MODEL_ARCH.QWEN2, False),
    "qwen3": (gguf.MODEL_ARCH.QWEN3, False),
    "gemma3_text": (gguf.MODEL_ARCH.GEMMA3, False),
    "phi3": (gguf.MODEL_ARCH.PHI3, False),
}


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    rope = cfg["rope_parameters"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def add_tokenizer(w: gguf.GGUFWriter, fixture: Path, cfg: dict):
    tok = json.loads((fixture / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [""] * len(vocab)
    for piece, idx in vocab.items():
        tokens[idx] = piece
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    specials = {t["id"] for t in tok["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(True)


def add_metadata(w: gguf.GGUFWriter, cfg: dict, model_type: str):
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    if model_type == "gemma3_text":
        rope = cfg["rope_parameters"]
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        # llama.cpp scales Gemma 3's scores by 1/sqrt(head_dim); the fixture's query_pre_attn_scalar
        # differs, so the file states its scale (`gemma3.attention.scale`, a key llama.cpp defines).
        w.add_attention_scale(cfg["query_pre_attn_scalar"] ** -0.5)
    else:
        rope = cfg.get("rope_parameters") or {}
        w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if head_dim != cfg["hidden_size"] // heads:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        if cfg.get("sliding_window") and model_type in ("mistral", "phi3"):
            w.add_sliding_window(cfg["sliding_window"])


def write(fixture: Path, out: Path, extra=None):
    cfg = json.loads((fixture / "config.json").read_text())
    model_type = cfg["model_type"]
    arch, permuted = ARCHS[model_type]
    weights = {k: v.float() for k, v in load_file(str(fixture / "model.safetensors")).items()}
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(fixture.name)
    add_metadata(w, cfg, model_type)
    add_tokenizer(w, fixture, cfg)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for hf, t in weights.items():
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        if permuted and hf.endswith("q_proj.weight"):
            t = permute(t, heads)
        if permuted and hf.endswith("k_proj.weight"):
            t = permute(t, kv)
        if model_type == "gemma3_text" and hf.endswith("norm.weight"):
            t = t + 1  # convert_hf_to_gguf.py's Gemma3Model.norm_shift
        if t.ndim == 1:
            w.add_tensor(name, t.numpy().astype(np.float32))
        else:
            bf16 = gguf.quants.quantize(t.numpy(), gguf.GGMLQuantizationType.BF16)
            assert np.array_equal(gguf.quants.dequantize(bf16, gguf.GGMLQuantizationType.BF16), t.numpy()), hf
            w.add_tensor(name, bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    if extra:
        extra(w, cfg)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"[{fixture.name}] wrote {out.relative_to(fixture.parent.parent.parent)} ({out.stat().st_size} bytes)")


def write_gguf(fixture: Path):
    write(fixture, fixture / "model.gguf")


def write_llama3_gguf(fixture: Path):
    """The ``llama`` fixture (llama3 RoPE scaling) as llama.cpp converts LLaMA 3.x."""

    def rope_freqs(w: gguf.GGUFWriter, cfg: dict):
        w.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(cfg))

    write(fixture, fixture / "llama3.gguf", rope_freqs)

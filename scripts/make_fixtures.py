#!/usr/bin/env python3
"""Build tiny random Hugging Face-format checkpoints plus HF reference outputs.

This script writes small test fixtures under ``tests/fixtures/<name>/`` (relative
to the repository root, found from this script's location). The Rust test suite
uses them to check the loaders, the tokenizer and the forward/generation code
against the Hugging Face ``transformers`` implementation.

Each fixture directory holds:

* ``config.json``, ``generation_config.json``, and the weights
  (``model.safetensors``, or shards plus ``model.safetensors.index.json``),
  exactly as ``save_pretrained`` writes them;
* ``tokenizer.json``, ``tokenizer_config.json`` (and whatever else
  ``PreTrainedTokenizerFast.save_pretrained`` writes): a byte-level BPE with
  384 tokens, trained on the text of /usr/share/common-licenses/GPL-3, with the
  special tokens and BOS post-processor of the real model family;
* ``reference.safetensors``: ``logits.{i}`` of shape [prompt_len, vocab]
  (float32), the logits at every position of prompt i from one unpadded
  forward pass;
* ``reference.json``: prompts, input ids, greedy continuations (16 tokens, EOS
  not treated as a stop), beam search results (4 beams, 12 new tokens, 2 best
  sequences and their ``sequences_scores``), versions of the generating
  libraries.
* ``penalties.json`` + ``penalties.safetensors``: sampling penalties (see
  ``penalty_references``): for each penalty setting and prompt, the greedy
  continuation of HF ``generate`` with HF's ``RepetitionPenaltyLogitsProcessor``
  and vLLM's presence/frequency formula as a logits processor, and one step's
  raw and processed logits (``raw.{case}.{i}``, ``processed.{case}.{i}``).
  ``--penalties`` writes only these two files from the checkpoints on disk,
  leaving every other file untouched.
* ``reference.{f16,bf16}.safetensors`` + ``reference.{f16,bf16}.json``: the
  same model loaded by HF in float16 / bfloat16 (see ``half_references``):
  logits per prompt and greedy ids with each step's top-1/top-2 margin.
  ``--half`` writes only these four files from the checkpoints on disk,
  leaving every other file untouched.

Fixtures:

* ``opt``                 OPT, pre-LayerNorm, tied LM head, f32.
* ``opt-postln-proj``     OPT, post-LayerNorm, word_embed_proj_dim 32 != hidden 64
                          (project_in / project_out, like OPT-350m), f32.
* ``llama``               LLaMA, GQA (4 query heads, 2 KV heads), untied head,
                          llama3 RoPE scaling, stored in bfloat16.
* ``llama-tied-sharded``  LLaMA, MHA, tied head, linear RoPE scaling, f32,
                          sharded safetensors with an index file.
* ``gpt2``                GPT-2 (Conv1D weights), tied head, stored in float16.

``--arch`` writes only the fixtures of the newer architectures (``ARCH_SPECS``: Gemma 3, Qwen2,
Qwen3, Mistral, Phi-3), each with a ``model.gguf`` copy written by the ``gguf`` package
(``scripts/make_gguf_fixtures.py``), and ``llama/llama3.gguf`` (LLaMA 3 RoPE as
``rope_freqs.weight``), leaving everything else untouched.

The model seeds are picked deterministically: for each fixture a short fixed
list of seeds is tried and the first one whose greedy continuations are varied,
contain no EOS, have a clear top-1/top-2 logit margin at every step, and whose
greedy and beam results are unchanged when the same weights run in float64 is
kept (so a small numerical difference on the Rust side should not flip them).

Run (from the repository root; needs only PyPI, never the HF hub):

    python3 -m venv ~/.cache/burn-llm-fixtures-venv && \
    ~/.cache/burn-llm-fixtures-venv/bin/pip install -r scripts/requirements-fixtures.txt && \
    ~/.cache/burn-llm-fixtures-venv/bin/python scripts/make_fixtures.py

The script is deterministic and re-runnable; it replaces the fixture
directories it owns and leaves everything else alone.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

import copy
import json
import shutil
import sys
from pathlib import Path

import safetensors
import tokenizers
import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    OPTConfig,
    OPTForCausalLM,
    PreTrainedTokenizerFast,
    RepetitionPenaltyLogitsProcessor,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = Path("/usr/share/common-licenses/GPL-3")

VOCAB_SIZE = 384
HIDDEN = 64
LAYERS = 2
HEADS = 4
FFN = 128
MAX_POS = 128
INIT_STD = 0.2

PROMPTS = [
    "The licenses for most software",
    "You should also get your employer",
    "Everyone is permitted to copy and distribute verbatim copies of this license document, "
    "but changing it is not allowed.",
    "GNU",
]

GREEDY_NEW_TOKENS = 16
BEAM = {"num_beams": 4, "max_new_tokens": 12, "length_penalty": 1.0, "early_stopping": False}
BEAM_RETURN = 2

# Seed selection criteria (see module docstring).
SEEDS = list(range(1000, 1100))
MIN_DISTINCT_GREEDY = 6
MIN_TOP2_MARGIN = 2e-2

MAX_FIXTURE_BYTES = 1_000_000

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
transformers.utils.logging.disable_progress_bar()


# --------------------------------------------------------------------------- tokenizers


def corpus_lines() -> list[str]:
    text = CORPUS.read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def train_bpe(vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return tok


def build_tokenizer(family: str) -> tuple[Tokenizer, dict]:
    """Returns the raw tokenizer and the kwargs for PreTrainedTokenizerFast."""
    if family == "opt":
        specials = ["<s>", "<pad>", "</s>", "<unk>"]
        tok = train_bpe(VOCAB_SIZE, specials)
        tok.post_processor = processors.TemplateProcessing(
            single="</s> $A:0",
            pair="</s> $A:0 $B:1",
            special_tokens=[("</s>", 2)],
        )
        kwargs = dict(bos_token="</s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
        expect = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    elif family == "llama":
        specials = ["<unk>", "<s>", "</s>"]
        tok = train_bpe(VOCAB_SIZE, specials)
        tok.post_processor = processors.TemplateProcessing(
            single="<s>:0 $A:0",
            pair="<s>:0 $A:0 <s>:1 $B:1",
            special_tokens=[("<s>", 1)],
        )
        kwargs = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
        expect = {"<unk>": 0, "<s>": 1, "</s>": 2}
    elif family == "gpt2":
        tok = train_bpe(VOCAB_SIZE - 1, [])
        assert tok.get_vocab_size() == VOCAB_SIZE - 1, tok.get_vocab_size()
        # Like the real GPT-2 tokenizer.json, <|endoftext|> is the last entry of the
        # BPE model's vocab and also an added (special) token with that id.
        data = json.loads(tok.to_str())
        data["model"]["vocab"]["<|endoftext|>"] = VOCAB_SIZE - 1
        tok = Tokenizer.from_str(json.dumps(data))
        tok.add_special_tokens(["<|endoftext|>"])
        # ByteLevel post-processor (adds no tokens), as in the real GPT-2 tokenizer.json.
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        kwargs = dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")
        expect = {"<|endoftext|>": VOCAB_SIZE - 1}
    else:
        raise ValueError(family)
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE, tok.get_vocab_size()
    for name, idx in expect.items():
        assert tok.token_to_id(name) == idx, (family, name, tok.token_to_id(name))
    return tok, kwargs


def save_tokenizer(tok: Tokenizer, kwargs: dict, out: Path):
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()), **kwargs)
    hf.save_pretrained(out)
    # Reload from disk and check that it encodes exactly like the raw tokenizer.
    reloaded = AutoTokenizer.from_pretrained(out)
    from_file = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in PROMPTS:
        want = tok.encode(text).ids
        got = reloaded(text).input_ids
        assert got == want, (out.name, text, got, want)
        assert from_file.encode(text).ids == want, (out.name, text)
    return reloaded


# --------------------------------------------------------------------------- models


def perturb_norms_and_biases(model: torch.nn.Module, seed: int):
    """HF inits biases to 0 and norm weights to 1; randomise them so that a loader
    which drops a bias or a norm weight is caught by the reference comparison."""
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1 and name.endswith(".weight"):  # LayerNorm / RMSNorm gains
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))


def opt_config(post_ln_proj: bool) -> OPTConfig:
    return OPTConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        ffn_dim=FFN,
        num_attention_heads=HEADS,
        max_position_embeddings=MAX_POS,
        do_layer_norm_before=not post_ln_proj,
        word_embed_proj_dim=32 if post_ln_proj else HIDDEN,
        activation_function="relu",
        enable_bias=True,
        dropout=0.0,
        attention_dropout=0.0,
        init_std=INIT_STD,
        tie_word_embeddings=True,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
    )


def llama_config(tied_sharded: bool) -> LlamaConfig:
    if tied_sharded:
        rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
        kv_heads, tie = HEADS, True
    else:
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 10000.0,
        }
        kv_heads, tie = 2, False
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5,
        rope_parameters=rope,
        tie_word_embeddings=tie,
        initializer_range=INIT_STD,
        bos_token_id=1,
        eos_token_id=2,
    )


def gpt2_config() -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=MAX_POS,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=None,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=INIT_STD,
        tie_word_embeddings=True,
        bos_token_id=VOCAB_SIZE - 1,
        eos_token_id=VOCAB_SIZE - 1,
    )


FIXTURE_SPECS = [
    # name, tokenizer family, model class, config factory, storage dtype, max_shard_size
    ("opt", "opt", OPTForCausalLM, lambda: opt_config(False), torch.float32, None),
    ("opt-postln-proj", "opt", OPTForCausalLM, lambda: opt_config(True), torch.float32, None),
    ("llama", "llama", LlamaForCausalLM, lambda: llama_config(False), torch.bfloat16, None),
    ("llama-tied-sharded", "llama", LlamaForCausalLM, lambda: llama_config(True), torch.float32, "100KB"),
    ("gpt2", "gpt2", GPT2LMHeadModel, gpt2_config, torch.float16, None),
]


# Sliding window of the architectures that have one: shorter than the long prompt plus its
# continuation, so local layers see a different context than global attention would.
WINDOW = 8


def common_kwargs(kv_heads: int, tie: bool) -> dict:
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        initializer_range=INIT_STD,
        bos_token_id=1,
        eos_token_id=2,
    )


def gemma3_config() -> Gemma3TextConfig:
    # head_dim 32 != hidden / heads, query_pre_attn_scalar != head_dim, two local layers (window 8,
    # RoPE base 10 000) then a global one (base 1e6), final logit softcapping.
    kwargs = common_kwargs(kv_heads=2, tie=True)
    kwargs["num_hidden_layers"] = 3
    return Gemma3TextConfig(
        **kwargs,
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        sliding_window_pattern=3,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        pad_token_id=0,
    )


def qwen2_config() -> Qwen2Config:
    return Qwen2Config(**common_kwargs(kv_heads=2, tie=False), rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def qwen3_config() -> Qwen3Config:
    return Qwen3Config(**common_kwargs(kv_heads=2, tie=True), head_dim=32, attention_bias=False)


def mistral_config() -> MistralConfig:
    return MistralConfig(**common_kwargs(kv_heads=2, tie=False), sliding_window=WINDOW)


def phi3_config() -> Phi3Config:
    kwargs = common_kwargs(kv_heads=2, tie=False)
    return Phi3Config(**kwargs, sliding_window=WINDOW, pad_token_id=0, original_max_position_embeddings=MAX_POS)


# The architectures of issue 31, each also written as GGUF (see ``write_gguf``).
ARCH_SPECS = [
    ("gemma3", "llama", Gemma3ForCausalLM, gemma3_config, torch.bfloat16, None),
    ("qwen2", "llama", Qwen2ForCausalLM, qwen2_config, torch.bfloat16, None),
    ("qwen3", "llama", Qwen3ForCausalLM, qwen3_config, torch.bfloat16, None),
    ("mistral", "llama", MistralForCausalLM, mistral_config, torch.bfloat16, None),
    ("phi3", "llama", Phi3ForCausalLM, phi3_config, torch.bfloat16, None),
]


def new_model(cls, config, seed: int, storage_dtype: torch.dtype):
    torch.manual_seed(seed)
    config = copy.deepcopy(config)
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    perturb_norms_and_biases(model, seed)
    if config.model_type == "gemma3_text":
        # Gemma multiplies embeddings by sqrt(hidden): a table drawn at INIT_STD would drown every
        # layer's output in the residual stream (greedy then repeats its input token).
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(config.hidden_size**-0.25)
    model.eval()
    # Round-trip through the storage dtype so that selection runs on exactly the
    # weights the reference will be computed from.
    if storage_dtype != torch.float32:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(storage_dtype).to(torch.float32))
    return model


@torch.no_grad()
def manual_greedy(model, ids: list[int], n: int) -> tuple[list[int], float]:
    """Greedy decoding by full re-forward at each step; EOS is not special.
    Returns the new ids and the smallest top-1 minus top-2 logit gap seen."""
    seq = list(ids)
    min_margin = float("inf")
    for _ in range(n):
        logits = model(torch.tensor([seq])).logits[0, -1].float()
        top = torch.topk(logits, 2)
        min_margin = min(min_margin, float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    return seq[len(ids):], min_margin


def acceptable(model, prompt_ids: list[list[int]], eos: int, pad: int | None) -> tuple[bool, float]:
    """Greedy must be varied, EOS-free and have a clear argmax at every step; greedy
    and beam results must be identical when the same weights run in float64 (a proxy
    for "an independent float32 implementation will reproduce them")."""
    model64 = copy.deepcopy(model).double()
    worst = float("inf")
    for ids in prompt_ids:
        new, margin = manual_greedy(model, ids, GREEDY_NEW_TOKENS)
        worst = min(worst, margin)
        if len(set(new)) < MIN_DISTINCT_GREEDY or eos in new or margin < MIN_TOP2_MARGIN:
            return False, worst
        if manual_greedy(model64, ids, GREEDY_NEW_TOKENS)[0] != new:
            return False, worst
        if beam_search(model, ids, eos, pad)[0] != beam_search(model64, ids, eos, pad)[0]:
            return False, worst
    return True, worst


@torch.no_grad()
def beam_search(model, ids: list[int], eos: int, pad: int | None):
    """HF beam search; returns the generated ids (prompt and trailing padding
    stripped) of the BEAM_RETURN best beams and their sequences_scores."""
    input_ids = torch.tensor([ids])
    beam = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        num_beams=BEAM["num_beams"],
        max_new_tokens=BEAM["max_new_tokens"],
        length_penalty=BEAM["length_penalty"],
        early_stopping=BEAM["early_stopping"],
        num_return_sequences=BEAM_RETURN,
        eos_token_id=eos,
        pad_token_id=pad if pad is not None else eos,
        return_dict_in_generate=True,
        output_scores=True,
    )
    sequences = []
    for row in beam.sequences:
        gen = row[len(ids):].tolist()
        if eos in gen:  # anything after the first EOS is padding
            gen = gen[: gen.index(eos) + 1]
        sequences.append(gen)
    scores = [float(s) for s in beam.sequences_scores]
    assert len(sequences) == BEAM_RETURN and len(scores) == BEAM_RETURN
    return sequences, scores


@torch.no_grad()
def greedy_generate(model, input_ids, n: int, eos: int, pad: int | None, **kwargs):
    """HF ``generate``, greedy, ``n`` new tokens, EOS not a stop (see ``reference_outputs``)."""
    return model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        num_beams=1,
        max_new_tokens=n,
        eos_token_id=None,
        pad_token_id=pad if pad is not None else eos,
        **kwargs,
    )


def reference_outputs(model, tok, tok_hf, prompt_ids: list[list[int]], eos: int, pad: int | None):
    logits_tensors = {}
    prompts = []
    for i, (text, ids) in enumerate(zip(PROMPTS, prompt_ids)):
        input_ids = torch.tensor([ids])
        logits = model(input_ids).logits[0].float().contiguous()
        assert logits.shape == (len(ids), VOCAB_SIZE), logits.shape
        logits_tensors[f"logits.{i}"] = logits

        # Greedy, EOS disabled. The manual loop (no KV cache, EOS not special) is the
        # ground truth; HF generate with eos_token_id=None must agree and give 16 tokens.
        # NB: eos_token_id=None must be passed as a generate() kwarg: a GenerationConfig
        # object with eos_token_id=None gets its None filled back in from the model's
        # generation_config by transformers 5 (None means "unset" there).
        greedy_manual, _ = manual_greedy(model, ids, GREEDY_NEW_TOKENS)
        out = greedy_generate(model, input_ids, GREEDY_NEW_TOKENS, eos, pad)
        greedy = out[0, len(ids):].tolist()
        assert len(greedy) == GREEDY_NEW_TOKENS, (len(greedy), greedy)
        assert greedy == greedy_manual, (greedy, greedy_manual)

        # Beam search, EOS active (as configured by the model).
        sequences, scores = beam_search(model, ids, eos, pad)

        greedy_text = tok_hf.decode(greedy, skip_special_tokens=True)
        assert greedy_text == tok.decode(greedy, skip_special_tokens=True), greedy_text

        prompts.append(
            {
                "text": text,
                "input_ids": ids,
                "greedy_ids": greedy,
                "greedy_text": greedy_text,
                "beam": {
                    **BEAM,
                    "num_return_sequences": BEAM_RETURN,
                    "sequences": sequences,
                    "scores": scores,
                },
            }
        )
    return logits_tensors, prompts


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_fixture(name, family, cls, config_fn, storage_dtype, shard):
    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    tok, tok_kwargs = build_tokenizer(family)
    tok_hf = save_tokenizer(tok, tok_kwargs, out)
    prompt_ids = [tok_hf(t).input_ids for t in PROMPTS]

    config = config_fn()
    eos, bos = config.eos_token_id, config.bos_token_id
    pad = getattr(config, "pad_token_id", None)

    chosen = None
    for seed in SEEDS:
        model = new_model(cls, config, seed, storage_dtype)
        ok, margin = acceptable(model, prompt_ids, eos, pad)
        if ok:
            chosen = (seed, margin)
            break
    if chosen is None:
        raise SystemExit(f"{name}: no seed in {SEEDS[0]}..{SEEDS[-1]} met the criteria")
    seed, margin = chosen
    print(f"[{name}] seed {seed}, min greedy top-2 margin {margin:.4f}")

    model = new_model(cls, config, seed, storage_dtype)
    save_kwargs = {"max_shard_size": shard} if shard else {}
    model.to(storage_dtype).save_pretrained(out, **save_kwargs)
    del model

    # Reference outputs come from the checkpoint on disk, reloaded in float32.
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    assert next(model.parameters()).dtype == torch.float32
    logits, prompts = reference_outputs(model, tok, tok_hf, prompt_ids, eos, pad)
    save_file(logits, str(out / "reference.safetensors"), metadata={"format": "pt"})
    ref = {
        "generator": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
        },
        "seed": seed,
        "storage_dtype": str(storage_dtype).replace("torch.", ""),
        "eos_token_id": eos,
        "bos_token_id": bos,
        "pad_token_id": pad,
        "vocab_size": VOCAB_SIZE,
        "greedy_min_top2_margin": margin,
        "prompts": prompts,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=2, ensure_ascii=False) + "\n")


@torch.no_grad()
def verify(name: str):
    out = FIXTURES / name
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tok = AutoTokenizer.from_pretrained(out)
    ref = json.loads((out / "reference.json").read_text())
    stored = load_file(str(out / "reference.safetensors"))
    worst = 0.0
    for i, p in enumerate(ref["prompts"]):
        assert tok(p["text"]).input_ids == p["input_ids"]
        logits = model(torch.tensor([p["input_ids"]])).logits[0].float()
        diff = float((logits - stored[f"logits.{i}"]).abs().max())
        worst = max(worst, diff)
        assert diff < 1e-4, (name, i, diff)
        assert len(p["greedy_ids"]) == GREEDY_NEW_TOKENS
    size = dir_size(out)
    assert size < MAX_FIXTURE_BYTES, (name, size)
    return worst, size


# --------------------------------------------------------------------------- penalties

# Penalty settings checked against the Rust sampler: HF's repetition penalty (above and below 1),
# OpenAI's presence and frequency penalties as vLLM applies them, and all three at once.
PENALTY_CASES = [
    {"name": "repetition", "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.4},
    {"name": "repetition_below_one", "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 0.8},
    {"name": "presence", "presence_penalty": 1.5, "frequency_penalty": 0.0, "repetition_penalty": 1.0},
    {"name": "frequency", "presence_penalty": 0.0, "frequency_penalty": 0.9, "repetition_penalty": 1.0},
    {"name": "all", "presence_penalty": -0.5, "frequency_penalty": 0.6, "repetition_penalty": 1.5},
]
PENALTY_NEW_TOKENS = 12
# Generated tokens in the history of the step whose logits are stored.
PENALTY_STEP = 8


class OpenAIPenalties(LogitsProcessor):
    """vLLM's ``apply_penalties`` for presence and frequency: over the generated tokens only
    (``input_ids`` past the prompt), ``logits -= frequency * count`` then
    ``logits -= presence * (count > 0)``. HF transformers has no processor for them."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len = prompt_len
        self.presence = presence
        self.frequency = frequency

    def __call__(self, input_ids, scores):
        output = input_ids[:, self.prompt_len:]
        counts = torch.zeros_like(scores).scatter_add_(1, output, torch.ones_like(output, dtype=scores.dtype))
        scores = scores - self.frequency * counts
        return scores - self.presence * (counts > 0).to(scores.dtype)


def penalty_processors(case: dict, prompt_len: int) -> LogitsProcessorList:
    """vLLM's order: repetition (HF's processor, over prompt + output), then frequency, then
    presence."""
    processors = LogitsProcessorList()
    if case["repetition_penalty"] != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(case["repetition_penalty"]))
    if case["presence_penalty"] != 0.0 or case["frequency_penalty"] != 0.0:
        processors.append(OpenAIPenalties(prompt_len, case["presence_penalty"], case["frequency_penalty"]))
    return processors


@torch.no_grad()
def penalty_references(name: str):
    """Writes ``penalties.json`` and ``penalties.safetensors`` for fixture ``name`` from its
    checkpoint on disk: per case and prompt, HF ``generate``'s greedy continuation with the
    penalties (EOS not a stop), the smallest top-1/top-2 margin of the processed scores over its
    steps, and the raw and processed logits of the step after ``PENALTY_STEP`` tokens."""
    out = FIXTURES / name
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ref = json.loads((out / "reference.json").read_text())
    eos, pad = ref["eos_token_id"], ref["pad_token_id"]
    tensors = {}
    cases = []
    for case in PENALTY_CASES:
        prompts = []
        for i, p in enumerate(ref["prompts"]):
            ids = p["input_ids"]
            input_ids = torch.tensor([ids])
            processors = penalty_processors(case, len(ids))
            generated = greedy_generate(model, input_ids, PENALTY_NEW_TOKENS, eos, pad, logits_processor=processors,
                                        output_scores=True, return_dict_in_generate=True)
            greedy = generated.sequences[0, len(ids):].tolist()
            assert len(greedy) == PENALTY_NEW_TOKENS, (name, case["name"], greedy)
            margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in generated.scores)
            history = ids + greedy[:PENALTY_STEP]
            history_ids = torch.tensor([history])
            raw = model(history_ids).logits[:, -1, :].float()
            processed = processors(history_ids, raw.clone())
            tensors[f"raw.{case['name']}.{i}"] = raw[0].contiguous()
            tensors[f"processed.{case['name']}.{i}"] = processed[0].contiguous()
            prompts.append({"input_ids": ids, "greedy_ids": greedy, "min_top2_margin": margin,
                            "step_history": history})
        cases.append({**case, "prompts": prompts})
    save_file(tensors, str(out / "penalties.safetensors"), metadata={"format": "pt"})
    doc = {
        "generator": {"torch": torch.__version__, "transformers": transformers.__version__},
        "max_new_tokens": PENALTY_NEW_TOKENS,
        "step_generated_tokens": PENALTY_STEP,
        "cases": cases,
    }
    (out / "penalties.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    worst = min(p["min_top2_margin"] for c in cases for p in c["prompts"])
    print(f"[{name}] penalties: min greedy top-2 margin {worst:.4f}")


# --------------------------------------------------------------------------- half precision

HALF_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


@torch.no_grad()
def half_references(name: str):
    """Writes ``reference.{f16,bf16}.safetensors`` and ``reference.{f16,bf16}.json`` for fixture
    ``name`` from its checkpoint on disk, the model loaded in that dtype (eager attention, whose
    softmax runs in float32 as the Rust side's does): ``logits.{i}`` of one unpadded forward pass
    per prompt (the half-precision logits widened to float32), and HF ``generate``'s greedy
    continuation (KV cache, EOS not a stop) with the top-1/top-2 margin of every step, so that a
    test compares greedy ids only up to a step whose margin the dtype's rounding could flip."""
    out = FIXTURES / name
    ref = json.loads((out / "reference.json").read_text())
    eos, pad = ref["eos_token_id"], ref["pad_token_id"]
    for tag, dtype in HALF_DTYPES.items():
        model = AutoModelForCausalLM.from_pretrained(out, dtype=dtype, attn_implementation="eager")
        model.eval()
        assert next(model.parameters()).dtype == dtype
        tensors = {}
        prompts = []
        for i, p in enumerate(ref["prompts"]):
            ids = p["input_ids"]
            input_ids = torch.tensor([ids])
            logits = model(input_ids).logits[0]
            assert logits.dtype == dtype, logits.dtype
            tensors[f"logits.{i}"] = logits.float().contiguous()
            generated = greedy_generate(model, input_ids, GREEDY_NEW_TOKENS, eos, pad,
                                        output_scores=True, return_dict_in_generate=True)
            greedy = generated.sequences[0, len(ids):].tolist()
            assert len(greedy) == GREEDY_NEW_TOKENS, (name, tag, greedy)
            margins = []
            for step in generated.scores:
                top = step[0].float().topk(2).values
                margins.append(float(top[0] - top[1]))
            prompts.append({"input_ids": ids, "greedy_ids": greedy, "greedy_margins": margins,
                            "same_as_f32": greedy == p["greedy_ids"]})
        save_file(tensors, str(out / f"reference.{tag}.safetensors"), metadata={"format": "pt"})
        doc = {
            "generator": {"torch": torch.__version__, "transformers": transformers.__version__},
            "dtype": tag,
            "attn_implementation": "eager",
            "max_abs_logit": max(float(t.abs().max()) for t in tensors.values()),
            "prompts": prompts,
        }
        (out / f"reference.{tag}.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        f32 = load_file(str(out / "reference.safetensors"))
        drift = max(float((tensors[k] - f32[k]).abs().max()) for k in tensors)
        same = sum(p["same_as_f32"] for p in prompts)
        print(f"[{name}] {tag}: max |logit| {doc['max_abs_logit']:.3f}, max |{tag} - f32| {drift:.2e}, "
              f"greedy same as f32 for {same}/{len(prompts)} prompts")


def main():
    if sys.argv[1:] == ["--arch"]:
        from make_gguf_fixtures import write_gguf, write_llama3_gguf

        for spec in ARCH_SPECS:
            make_fixture(*spec)
            write_gguf(FIXTURES / spec[0])
            worst, size = verify(spec[0])
            print(f"verified {spec[0]:20s} total {size:8d} bytes, max |logits diff| on reload {worst:.2e}")
        write_llama3_gguf(FIXTURES / "llama")
        return 0
    if sys.argv[1:] == ["--penalties"]:
        for spec in FIXTURE_SPECS:
            penalty_references(spec[0])
        return 0
    if sys.argv[1:] == ["--half"]:
        for spec in FIXTURE_SPECS:
            half_references(spec[0])
        return 0
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"tokenizers {tokenizers.__version__}, safetensors {safetensors.__version__}")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for spec in FIXTURE_SPECS:
        make_fixture(*spec)

    print()
    print(f"{'file':60s} {'bytes':>9s}")
    for spec in FIXTURE_SPECS:
        out = FIXTURES / spec[0]
        for f in sorted(out.rglob("*")):
            if f.is_file():
                print(f"{str(f.relative_to(ROOT)):60s} {f.stat().st_size:9d}")
    print()
    for spec in FIXTURE_SPECS:
        worst, size = verify(spec[0])
        print(f"verified {spec[0]:20s} total {size:8d} bytes, max |logits diff| on reload {worst:.2e}")
    for spec in FIXTURE_SPECS:
        penalty_references(spec[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())

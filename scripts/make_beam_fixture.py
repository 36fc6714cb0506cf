#!/usr/bin/env python3
"""Record Hugging Face beam search runs for the `burn_paged::beam` replay tests.

Writes ``tests/fixtures/beam/beam_cases.json`` (relative to the repository root,
found from this script's location). Run with the fixtures venv:

    ~/.cache/burn-llm-fixtures-venv/bin/python scripts/make_beam_fixture.py

A tiny random ``LlamaForCausalLM`` (vocab 32, hidden 32, 2 layers, 4 heads,
init std 0.2, seeded, float32 on CPU) is run through
``model.generate(num_beams=W, do_sample=False, return_dict_in_generate=True,
output_scores=True, ...)`` for a list of cases covering beam widths 1-4, length
penalties 1.0 / 0.0 / 2.0 / -0.5, ``early_stopping`` False / True / "never",
zero, one or two EOS tokens, ``num_return_sequences`` 1..W and
``max_new_tokens`` 5..12.

For every generation step a recording ``LogitsProcessor`` (appended last, so it
sees exactly the tensor HF ranks) stores

* ``beams``: the generated tokens of every live beam, in HF's live-beam order
  (``input_ids[:, prompt_len:]`` as passed to the processors), and
* ``logprobs``: one row per live beam of the vector HF ranks with. In beam
  search that is ``log_softmax(logits.float())`` (HF applies log_softmax
  *before* the processors; there are none here besides the recorder). At the
  first step HF runs ``num_beams`` identical copies of the prompt; only the
  first row is stored (the script checks the copies are bitwise equal), because
  the engine runs the prompt once. With ``num_beams == 1`` ``generate`` runs
  *greedy search*, whose processors see raw logits; the script stores
  ``torch.log_softmax`` of them (the same op beam search uses) and checks the
  argmax is unchanged.

Each row is one string of space-separated float32 values in shortest
round-trip form (``repr(numpy.float32)``): full precision, parsed exactly by
Rust's ``str::parse::<f32>``. The script checks every value round-trips.

``expected`` holds HF's final hypotheses, best first: generated tokens (the
padding after a short hypothesis is cut using ``beam_indices``), and for beam
search ``score`` = ``sequences_scores``. Greedy search has no
``sequences_scores``; its ``sum_logprobs`` (float32 running sum of the chosen
tokens' log-probabilities) is stored instead.

EOS tokens are chosen per case, trying tokens in a fixed pseudo-random order
and keeping the first set for which at least one returned hypothesis ends in
an EOS token (so EOS is really hit); failing that (long hypotheses favoured by
a large length penalty), the set that is most often the argmax of a live
beam's row (so EOS hypotheses are recorded, then beaten). Deterministic:
rerunning gives a byte-identical file.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "beam" / "beam_cases.json"

MODEL_SEED = 1234
VOCAB = 32

# (name, num_beams, length_penalty, early_stopping, num_return_sequences, max_new_tokens, n_eos)
CASES = [
    ("greedy_no_eos", 1, 1.0, False, 1, 6, 0),
    # length_penalty / early_stopping do not matter to greedy search (beam search with one beam
    # would not stop at the first EOS with "never" and a positive penalty)
    ("greedy_eos_never", 1, 2.0, "never", 1, 10, 1),
    ("w2_lp1_esfalse_noeos", 2, 1.0, False, 2, 5, 0),
    ("w2_lp1_esfalse_eos", 2, 1.0, False, 1, 10, 1),
    ("w3_lp0_estrue_eos", 3, 0.0, True, 3, 8, 1),
    ("w3_lp2_never_eos", 3, 2.0, "never", 2, 12, 1),
    ("w4_lpneg_esfalse_eos", 4, -0.5, False, 4, 9, 1),
    ("w4_lp1_estrue_eos", 4, 1.0, True, 2, 7, 1),
    ("w4_lp2_esfalse_noeos", 4, 2.0, False, 3, 12, 0),
    ("w2_lp0_never_2eos", 2, 0.0, "never", 2, 10, 2),
    ("w3_lp1_esfalse_2eos", 3, 1.0, False, 1, 11, 2),
    ("w4_lp0_never_eos", 4, 0.0, "never", 4, 6, 1),
    ("w3_lpneg_estrue_noeos", 3, -0.5, True, 1, 5, 0),
    ("w2_lp2_estrue_eos", 2, 2.0, True, 2, 12, 1),
    ("w4_lp1_esfalse_eos_long", 4, 1.0, False, 3, 12, 1),
    ("w3_lpneg_never_eos", 3, -0.5, "never", 3, 9, 1),
]


def f32_str(x) -> str:
    """Shortest decimal that round-trips to the same float32 (numpy's `str`)."""
    x = np.float32(x)
    s = str(x)
    back = np.float32(s)
    if not (back == x or (np.isnan(x) and np.isnan(back))):
        raise AssertionError(f"float32 {x!r} does not round-trip through {s!r}")
    return s


def row_str(row: torch.Tensor) -> str:
    assert row.dtype == torch.float32
    return " ".join(f32_str(v) for v in row.numpy())


class Recorder(LogitsProcessor):
    """Stores (live-beam generated tokens, scores) at every step; returns scores unchanged."""

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len
        self.steps: list[tuple[list[list[int]], torch.Tensor]] = []

    def __call__(self, input_ids, scores):
        self.steps.append((input_ids[:, self.prompt_len :].tolist(), scores.detach().clone()))
        return scores


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(MODEL_SEED)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def run(model, prompt, num_beams, lp, es, nret, mnt, eos):
    prompt_len = len(prompt)
    rec = Recorder(prompt_len)
    kwargs = dict(
        do_sample=False,
        num_beams=num_beams,
        max_new_tokens=mnt,
        return_dict_in_generate=True,
        output_scores=True,
        logits_processor=LogitsProcessorList([rec]),
        pad_token_id=0,
    )
    kwargs.update(length_penalty=lp, early_stopping=es, num_return_sequences=nret)
    if eos:
        kwargs["eos_token_id"] = list(eos)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, prompt_len, dtype=torch.long), **kwargs)
    assert len(rec.steps) == len(out.scores), (len(rec.steps), len(out.scores))

    steps = []
    sum_lp = np.float32(0.0)
    for s, (beams, scores) in enumerate(rec.steps):
        if num_beams == 1:
            # greedy: processors (and out.scores) see raw logits; replay log_softmax of them
            assert torch.equal(scores, out.scores[s])
            lps = torch.log_softmax(scores, dim=-1)
            tok = int(out.sequences[0, prompt_len + s])
            assert int(torch.argmax(lps[0])) == tok == int(torch.argmax(scores[0]))
            sum_lp = np.float32(sum_lp + lps[0, tok].numpy())
        else:
            assert torch.equal(scores, out.scores[s])
            lps = scores
        assert lps.shape == (num_beams, VOCAB)
        if s == 0:
            for b in range(1, lps.shape[0]):
                assert torch.equal(lps[b], lps[0]), "first-step copies differ"
            rows, beams = lps[:1], beams[:1]
        else:
            rows = lps
        assert all(len(b) == s for b in beams)
        steps.append({"beams": beams, "logprobs": [row_str(r) for r in rows]})

    expected = []
    seqs = out.sequences[:, prompt_len:].tolist()
    if num_beams == 1:
        gen = seqs[0]
        expected.append({"tokens": gen, "score": None, "sum_logprobs": f32_str(sum_lp)})
    else:
        assert out.sequences.shape[0] == nret
        for i in range(nret):
            glen = int((out.beam_indices[i] >= 0).sum())
            expected.append(
                {"tokens": seqs[i][:glen], "score": f32_str(out.sequences_scores[i].numpy()), "sum_logprobs": None}
            )
    return steps, expected


def main() -> int:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    model = build_model()
    rng = random.Random(20240607)
    cases = []
    for name, nb, lp, es, nret, mnt, n_eos in CASES:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 7))]
        order = list(range(VOCAB))
        rng.shuffle(order)
        if n_eos == 0:
            eos_sets = [[]]
        else:
            eos_sets = [order[i : i + n_eos] for i in range(0, VOCAB - n_eos + 1, n_eos)]
        chosen = None
        fallback = None
        for eos in eos_sets:
            steps, expected = run(model, prompt, nb, lp, es, nret, mnt, eos)
            if not eos or any(e["tokens"] and e["tokens"][-1] in eos for e in expected):
                chosen = (eos, steps, expected)
                break
            # EOS is the best continuation of some live beam at some step: it becomes a
            # finished hypothesis even though it does not make the returned top list.
            n_top = sum(
                int(np.argmax(np.array(row.split(), dtype=np.float32))) in eos
                for st in steps[1:]
                for row in st["logprobs"]
            )
            if n_top > 0 and (fallback is None or n_top > fallback[0]):
                fallback = (n_top, (eos, steps, expected))
        if chosen is None:
            if fallback is None:
                raise AssertionError(f"{name}: no EOS choice is hit")
            chosen = fallback[1]
        eos, steps, expected = chosen
        cases.append(
            {
                "name": name,
                "num_beams": nb,
                "length_penalty": lp,
                "early_stopping": es,
                "num_return_sequences": nret,
                "max_new_tokens": mnt,
                "eos_token_ids": eos,
                "prompt": prompt,
                "hf_mode": "greedy" if nb == 1 else "beam_search",
                "steps": steps,
                "expected": expected,
            }
        )
        lens = [len(e["tokens"]) for e in expected]
        print(
            f"{name:26s} eos={eos!s:8s} steps={len(steps):2d}/{mnt:2d} lens={lens} "
            f"eos_ended={[bool(e['tokens']) and e['tokens'][-1] in eos for e in expected]}",
            file=sys.stderr,
        )
    doc = {
        "generator": {
            "script": "scripts/make_beam_fixture.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "model": "LlamaForCausalLM vocab 32, hidden 32, 2 layers, 4 heads, ffn 64, init std 0.2, float32, "
            f"seed {MODEL_SEED}",
        },
        "vocab_size": VOCAB,
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1) + "\n"
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

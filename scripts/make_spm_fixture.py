#!/usr/bin/env python3
"""Build ``tests/fixtures/spm/spm.json``: a tiny SentencePiece BPE vocabulary and what the real
``sentencepiece`` library makes of some test strings.

The model is trained the way LLaMA's ``tokenizer.model`` was (BPE, byte fallback, identity
normalization, no whitespace collapsing, a dummy-prefix space, whitespace-only pieces allowed) on
the text of /usr/share/common-licenses/GPL-3 plus a few lines with digits and non-ASCII letters.
The JSON holds what a GGUF file stores for such a tokenizer (``tokens``, ``scores``,
``token_types`` with llama.cpp's numbering, the special ids) and, for each test string, the ids
``sp.encode(text)`` gives (no BOS) and ``sp.decode(ids)``. The Rust test in
``models/src/gguf/spm.rs`` rebuilds the tokenizer from it and checks both.

Run (from anywhere; needs only PyPI):

    ~/.cache/burn-llm-fixtures-venv/bin/pip install -r scripts/requirements-fixtures.txt && \
    ~/.cache/burn-llm-fixtures-venv/bin/python scripts/make_spm_fixture.py

The script is deterministic and rewrites only tests/fixtures/spm/spm.json.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "spm" / "spm.json"
CORPUS = Path("/usr/share/common-licenses/GPL-3")
VOCAB_SIZE = 640  # 256 byte pieces + 3 specials + characters + a few hundred merges

EXTRA_LINES = [
    "In 2007, version 3 was published; 29 June 2007 is the date, and 1.0, 2.5 or 3.14 are numbers.",
    "Call 555-0100 or 555 0199 before 10:30 on 12/31/1999, 2000 and 2024.",
    "A café in Zürich serves crème brûlée; a naïve façade, déjà vu, résumé.",
    "Ελληνικά and русский text appear here too, with ß and ø.",
    "Tabs\tand  double  spaces,   triple   spaces too.",
    "Quotes: \"double\", 'single', (parens), [brackets], {braces}, <angles> & ampersands!",
]

# Edge cases first, then ordinary text. No control-token text such as "<s>": SentencePiece encodes
# it as plain text, while HF's converted tokenizer (like llama.cpp) matches it as the special token.
TEST_STRINGS = [
    "",
    " ",
    "  ",
    "a",
    "Hello world",
    " Hello world",
    "Hello world ",
    "Hello  world",
    "  leading and trailing  ",
    "line one\nline two\n",
    "\n\nblank lines\n\n",
    "tab\tseparated\tvalues",
    "The GNU General Public License is a free, copyleft license.",
    "You may convey verbatim copies of the Program's source code.",
    "Version 3, 29 June 2007",
    "1234567890 and 3.14159 and 2024-06-01",
    "Call 555-0100 before 10:30.",
    "A café in Zürich",
    "naïve résumé déjà vu",
    "日本語のテキスト",
    "日本",
    "emoji 🙂 and 🚀 rockets",
    "mixed: café 日本 123 ok",
    "Ελληνικά",
    "€100 £20 ¥3000",
    "ALL CAPS SHOUTING TEXT",
    "punctuation!?!... ;-) (ok) [x] {y}",
    "x < y and y > z, <tag> & </tag>",
    "a\u00a0non-breaking space",
    "trailing newline\n",
    "    indented code block",
    "x" * 40,
]

TYPE_IDS = {"normal": 1, "unknown": 2, "control": 3, "user_defined": 4, "unused": 5, "byte": 6}


def piece_type(sp: spm.SentencePieceProcessor, i: int) -> int:
    if sp.is_unknown(i):
        return TYPE_IDS["unknown"]
    if sp.is_control(i):
        return TYPE_IDS["control"]
    if sp.is_byte(i):
        return TYPE_IDS["byte"]
    if sp.is_unused(i):
        return TYPE_IDS["unused"]
    # The Python API has no is_user_defined; this fixture trains none.
    return TYPE_IDS["normal"]


def main() -> None:
    lines = [l for l in CORPUS.read_text(encoding="utf-8").splitlines() if l.strip()]
    lines += EXTRA_LINES * 4
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        split_digits=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    cases = []
    for text in TEST_STRINGS:
        ids = sp.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
    fixture = {
        "about": "SentencePiece BPE trained by scripts/make_spm_fixture.py; ids from sp.encode (no BOS)",
        "sentencepiece_version": spm.__version__,
        "add_space_prefix": True,
        "bos_token_id": sp.bos_id(),
        "eos_token_id": sp.eos_id(),
        "unknown_token_id": sp.unk_id(),
        "tokens": [sp.id_to_piece(i) for i in range(n)],
        "scores": [sp.get_score(i) for i in range(n)],
        "token_types": [piece_type(sp, i) for i in range(n)],
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {n} pieces, {len(cases)} cases)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Test vectors for burn-llm's GGUF dequantization: blocks of every quant type burn-llm reads and
their values decoded by the PyPI `gguf` package (`gguf.quants.dequantize`), the reference the
Rust decoder must match bit for bit.

For each type T it writes tests/fixtures/gguf-quants/T.blocks (raw GGML blocks, as they sit in a
GGUF file) and T.f32 (the package's decoded values, little-endian f32). Types the package can
quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantized from random values by the package; for the
K-quants (which it only decodes) the blocks are random bytes with finite, varied f16 scales, so
every code, sub-block scale and minimum bit pattern is exercised.

Run: python scripts/make_gguf_quant_fixtures.py  (needs numpy and gguf; see
scripts/requirements-fixtures.txt)
"""

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf-quants"
SEED = 31
ROWS = 3
COLS = 512  # two K-quant super-blocks of 256 per row

QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# Byte offsets of each K-quant block's f16 fields (d, and dmin where it has one).
K_HALVES = {
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


def k_blocks(rng: np.random.Generator, name: str) -> np.ndarray:
    qtype = GGMLQuantizationType[name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in K_HALVES[name]:
        # Scales of mixed sign and magnitude, including an f16 subnormal, never inf/NaN.
        halves = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-6, 1, n_blocks)).astype(np.float16)
        halves[0] = np.float16(3e-7)
        blocks[:, offset : offset + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(ROWS, -1)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for name in QUANTIZED + list(K_HALVES):
        qtype = GGMLQuantizationType[name]
        if name in QUANTIZED:
            values = (rng.standard_normal((ROWS, COLS)) * rng.uniform(0.01, 3.0, (ROWS, 1))).astype(np.float32)
            blocks = quants.quantize(values, qtype)
        else:
            blocks = k_blocks(rng, name)
        decoded = quants.dequantize(blocks, qtype).astype("<f4")
        assert decoded.shape == (ROWS, COLS), (name, decoded.shape)
        assert np.isfinite(decoded).all(), name
        (OUT / f"{name}.blocks").write_bytes(blocks.tobytes())
        (OUT / f"{name}.f32").write_bytes(decoded.tobytes())
        print(f"{name}: {blocks.nbytes} bytes of blocks, {decoded.size} values")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/quant_golden.bin: seeded blocks of each ggml type that
src/gguf dequantises, with the values llama.cpp's own Python package (`gguf`, 0.19.0 when
the committed file was made) dequantises them to. The Rust test in src/gguf/quant.rs
reads it; the package is only needed to regenerate it:

    pip install gguf==0.19.0 && python3 tools/gguf/quant_golden.py

Blocks are random bytes with their float16 scale fields set to random finite values in
[-2, 2] (a random f16 bit pattern would often be NaN or huge). Format, little-endian:
b"GQGOLD1\\n", then per type: u32 ggml type id, u32 elements, u32 bytes, the bytes, then
the elements as f32.
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# (type, block bytes, byte offsets of its float16 fields)
TYPES = [
    (T.Q4_0, 18, [0]),
    (T.Q4_1, 20, [0, 2]),
    (T.Q5_0, 22, [0]),
    (T.Q5_1, 24, [0, 2]),
    (T.Q8_0, 34, [0]),
    (T.Q2_K, 84, [80, 82]),
    (T.Q3_K, 110, [108]),
    (T.Q4_K, 144, [0, 2]),
    (T.Q5_K, 176, [0, 2]),
    (T.Q6_K, 210, [208]),
]
BLOCKS = 6


def main() -> None:
    rng = np.random.default_rng(20261202)
    out = bytearray(b"GQGOLD1\n")
    for ty, size, f16_at in TYPES:
        raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
        for off in f16_at:
            vals = rng.uniform(-2.0, 2.0, size=BLOCKS).astype(np.float16)
            raw[:, off : off + 2] = vals.view(np.uint8).reshape(BLOCKS, 2)
        data = raw.reshape(-1)
        values = dequantize(data, ty).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(values)), ty.name
        out += struct.pack("<III", int(ty), values.size, data.size)
        out += data.tobytes()
        out += values.astype("<f4").tobytes()
    path = Path(__file__).resolve().parents[2] / "tests/fixtures/gguf/quant_golden.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    print(f"wrote {path} ({len(out)} bytes, {len(TYPES)} types x {BLOCKS} blocks)", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Rewrites a llama GGUF with the tensor types of a Q4_K_M file, to check genslot's loader on
a K-quant model where no quantised checkpoint can be downloaded:

    pip install gguf==0.19.0
    python3 tools/gguf/requant.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-q4km.gguf [q6_k]
    GENSLOT_SMOLLM2_GGUF=/tmp/smollm2-q4km.gguf cargo test --release --test smollm2_gguf

Every weight is dequantised with llama.cpp's `gguf` package, then written in the manner of
llama.cpp's Q4_K_M recipe: Q6_K for the output head (the embedding table when tied) and for
attn_v and ffn_down in even layers (the recipe gives some tensors more bits), Q4_K elsewhere,
and, where a row's length is not a multiple of 256 (SmolLM2's
hidden size is 576), the fallback llama.cpp uses (Q5_0 for Q4_K, Q8_0 for Q6_K), quantised
by the `gguf` package. `q6_k` writes Q6_K wherever it can and Q8_0 elsewhere instead. Norms
stay F32; the metadata is copied as is.

The Q4_K and Q6_K quantisers here are plain min/max fits, not llama.cpp's error search: good
enough for the model to answer as before, not a measure of a K-quant's quality. Each tensor's
round trip (relative RMS error against the source) is printed.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

QK = 256
# Element e of a Q6_K block: its low-nibble byte and shift, its high-pair byte and shift.
_e = np.arange(QK)
_h, _s, _l = _e // 128, (_e % 128) // 32, _e % 32
Q6_LO_BYTE, Q6_LO_SHIFT = 64 * _h + 32 * (_s % 2) + _l, 4 * (_s // 2)
Q6_HI_BYTE, Q6_HI_SHIFT = 32 * _h + _l, 2 * _s
# Element e of a Q4_K block: its byte and shift.
Q4_BYTE, Q4_SHIFT = 32 * (_e // 64) + _e % 32, 4 * ((_e % 64) // 32)


def f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x as float16 bytes (n, 2) and as the float32 the reader will see."""
    h = x.astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def pack(values: np.ndarray, byte: np.ndarray, shift: np.ndarray, nbytes: int) -> np.ndarray:
    """ORs each block's values (n, 256) into `nbytes` bytes at (byte, shift) per element."""
    out = np.zeros((values.shape[0], nbytes), dtype=np.uint8)
    for e in range(QK):
        out[:, byte[e]] |= (values[:, e].astype(np.uint8) << shift[e]).astype(np.uint8)
    return out


def q6_k(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 210) Q6_K blocks: 16 signed scales against one d."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    sc = np.abs(sub).max(-1) / 31.0
    d_bytes, d = f16(sc.max(-1) / 127.0)
    sc_q = np.clip(np.rint(safe_div(sc, d[:, None])), 0, 127)
    dl = (d[:, None] * sc_q)[:, :, None]
    q = np.clip(np.rint(safe_div(sub, np.broadcast_to(dl, sub.shape))), -32, 31).astype(np.int16)
    u = (q + 32).reshape(n, QK)
    ql = pack(u & 0x0F, Q6_LO_BYTE, Q6_LO_SHIFT, 128)
    qh = pack(u >> 4, Q6_HI_BYTE, Q6_HI_SHIFT, 64)
    scales = sc_q.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh, scales, d_bytes], axis=1)


def q4_k(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 144) Q4_K blocks: 8 (scale, min) pairs of 6 bits."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    sc = (sub.max(-1) - lo) / 15.0
    mn = -lo
    d_bytes, d = f16(sc.max(-1) / 63.0)
    dmin_bytes, dmin = f16(mn.max(-1) / 63.0)
    sc_q = np.clip(np.rint(safe_div(sc, d[:, None])), 0, 63).astype(np.uint8)
    mn_q = np.clip(np.rint(safe_div(mn, dmin[:, None])), 0, 63).astype(np.uint8)
    step = (d[:, None] * sc_q)[:, :, None]
    off = (dmin[:, None] * mn_q)[:, :, None]
    q = np.clip(np.rint(safe_div(sub + off, np.broadcast_to(step, sub.shape))), 0, 15)
    p = np.zeros((n, 12), dtype=np.uint8)
    for j in range(4):
        p[:, j] = sc_q[:, j] | ((sc_q[:, j + 4] >> 4) << 6)
        p[:, j + 4] = mn_q[:, j] | ((mn_q[:, j + 4] >> 4) << 6)
        p[:, 8 + j] = (sc_q[:, j + 4] & 0x0F) | ((mn_q[:, j + 4] & 0x0F) << 4)
    qs = pack(q.reshape(n, QK).astype(np.uint8), Q4_BYTE, Q4_SHIFT, 128)
    return np.concatenate([d_bytes, dmin_bytes, p, qs], axis=1)


def target(name: str, row: int, recipe: str) -> T:
    if not name.endswith(".weight") or name.endswith("norm.weight"):
        return T.F32
    want = T.Q4_K if recipe == "q4_k_m" else T.Q6_K
    # The output head (the embedding table, when tied) and the even layers' attn_v and
    # ffn_down take Q6_K, as the recipe gives some tensors more bits.
    if name in ("output.weight", "token_embd.weight"):
        want = T.Q6_K
    if name.startswith("blk.") and name.endswith(("attn_v.weight", "ffn_down.weight")):
        if int(name.split(".")[1]) % 2 == 0:
            want = T.Q6_K
    if row % QK == 0:
        return want
    return {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}[want]


def main(src: str, dst: str, recipe: str) -> None:
    r = GGUFReader(src)
    arch = r.get_field("general.architecture").contents()
    w = GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(name, field.contents(), field.types[0], sub)
    for t in r.tensors:
        row = int(t.shape[0])
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1, row)
        ty = target(t.name, row, recipe)
        if ty == T.F32:
            w.add_tensor(t.name, x.reshape(-1) if len(t.shape) == 1 else x)
            continue
        if ty in (T.Q4_K, T.Q6_K):
            blocks = (q4_k if ty == T.Q4_K else q6_k)(x.reshape(-1, QK))
            data = blocks.reshape(x.shape[0], -1)
        else:
            data = quantize(x, ty)
        back = dequantize(data, ty).reshape(x.shape)
        err = np.sqrt(np.mean((back - x) ** 2) / max(np.mean(x**2), 1e-30))
        print(f"{t.name:28} {t.tensor_type.name:5} -> {ty.name:5} rel. RMS error {err:.4f}")
        w.add_tensor(t.name, data, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {dst}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["q4_k_m"], ["q6_k"]):
        sys.exit("usage: requant.py SRC.gguf DST.gguf [q4_k_m|q6_k]")
    main(sys.argv[1], sys.argv[2], (sys.argv[3:] or ["q4_k_m"])[0])

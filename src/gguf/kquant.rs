//! ggml's K-quants: super-blocks of 256 values in 16 or 8 sub-blocks, each with its own
//! scale (and for Q2_K, Q4_K and Q5_K its own minimum), the sub-block scales themselves
//! quantised against one or two float16 factors. Most llama GGUFs are of these (Q4_K_M is
//! Q4_K with Q6_K for some tensors). Layouts follow ggml's `ggml-common.h`; each function
//! appends one super-block's 256 values. Every value is (factor · sub-block scale) · q, minus
//! (min factor · sub-block min) where there is one, in f32 and in that order, as ggml
//! computes them: a test holds every type to the bits that llama.cpp's Python package
//! (`gguf`) gives for the same blocks.

use half::f16;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Sub-block k's 16 values (k of 16) as the 2-bit fields of Q2_K and Q3_K hold them: bits
/// 2s..2s+2 of the bytes 32·(k/8) + 16·(k%2) .. + 16 of `qs`, s = (k%8)/2.
fn crumbs(qs: &[u8], k: usize) -> impl Iterator<Item = u8> + '_ {
    let shift = 2 * ((k % 8) / 2);
    qs[32 * (k / 8) + 16 * (k % 2)..][..16]
        .iter()
        .map(move |&q| (q >> shift) & 3)
}

/// Q2_K (84 bytes): 16 bytes of sub-block scale (low nibble) and min (high nibble), 64 bytes
/// of 2-bit values, then d and dmin.
pub fn q2_k(b: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (k, &sc) in scales.iter().enumerate() {
        let dl = d * f32::from(sc & 0x0f);
        let ml = dmin * f32::from(sc >> 4);
        out.extend(crumbs(qs, k).map(|q| dl * f32::from(q) - ml));
    }
}

/// Q3_K (110 bytes): a 32-byte high-bit mask, 64 bytes of 2-bit values, 12 bytes of 16
/// 6-bit scales (offset by 32), then d. Value e takes its low bits as Q2_K does and is
/// lowered by 4 where bit e/32 of mask byte e%32 is clear.
pub fn q3_k(b: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for k in 0..16 {
        // Scale k: its low nibble is byte k's (k < 8) or the high nibble of byte k - 8; its
        // top two bits are bits 2·(k/4) of byte 8 + k%4.
        let low = if k < 8 {
            packed[k] & 0x0f
        } else {
            packed[k - 8] >> 4
        };
        let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
        let dl = d * f32::from((low | (high << 4)) as i8 - 32);
        let mask = &hmask[16 * (k % 2)..][..16];
        let bit = k / 2;
        out.extend(crumbs(qs, k).zip(mask).map(|(q, &h)| {
            let q = i16::from(q) - if (h >> bit) & 1 == 0 { 4 } else { 0 };
            dl * f32::from(q)
        }));
    }
}

/// Sub-block j's (scale, min) of Q4_K and Q5_K: eight 6-bit pairs in 12 bytes, the first
/// four whole in bytes 0..8, the last four split between the nibbles of bytes 8..12 and the
/// top two bits of bytes 0..8.
fn scale_min(p: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (p[j] & 63, p[j + 4] & 63)
    } else {
        (
            (p[j + 4] & 0x0f) | ((p[j - 4] >> 6) << 4),
            (p[j + 4] >> 4) | ((p[j] >> 6) << 4),
        )
    };
    (f32::from(sc), f32::from(m))
}

/// Sub-block j's 32 nibbles (j of 8) in Q4_K and Q5_K: the low (even j) or high nibbles of
/// bytes 32·(j/2) .. + 32 of `qs`.
fn nibbles(qs: &[u8], j: usize) -> impl Iterator<Item = u8> + '_ {
    let shift = 4 * (j % 2);
    qs[32 * (j / 2)..][..32]
        .iter()
        .map(move |&q| (q >> shift) & 0x0f)
}

/// Q4_K (144 bytes): d, dmin, 12 bytes of scales and mins, 128 bytes of 4-bit values in 8
/// sub-blocks of 32.
pub fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (packed, qs) = (&b[4..16], &b[16..144]);
    for j in 0..8 {
        let (sc, m) = scale_min(packed, j);
        let (dl, ml) = (d * sc, dmin * m);
        out.extend(nibbles(qs, j).map(|q| dl * f32::from(q) - ml));
    }
}

/// Q5_K (176 bytes): Q4_K's fields with a 32-byte fifth-bit plane between the scales and the
/// nibbles: value l of sub-block j has bit j of plane byte l as its fifth bit.
pub fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (packed, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for j in 0..8 {
        let (sc, m) = scale_min(packed, j);
        let (dl, ml) = (d * sc, dmin * m);
        out.extend(
            nibbles(qs, j)
                .zip(qh)
                .map(|(q, &h)| dl * f32::from(q | (((h >> j) & 1) << 4)) - ml),
        );
    }
}

/// Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed
/// sub-block scales, then d. In half h = e/128, with s = (e%128)/32 and l = e%32, value e is
/// the low (s < 2) or high nibble of low byte 64h + 32·(s%2) + l, with bits 2s..2s+2 of
/// high byte 32h + l on top, minus 32.
pub fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (k, &sc) in scales.iter().enumerate() {
        let (h, s, l0) = (k / 8, (k % 8) / 2, 16 * (k % 2));
        let dl = d * f32::from(sc as i8);
        let lows = &ql[64 * h + 32 * (s % 2) + l0..][..16];
        let highs = &qh[32 * h + l0..][..16];
        let nib = 4 * (s / 2);
        out.extend(lows.iter().zip(highs).map(|(&lo, &hi)| {
            let q = ((lo >> nib) & 0x0f) | (((hi >> (2 * s)) & 3) << 4);
            dl * f32::from(i16::from(q) - 32)
        }));
    }
}

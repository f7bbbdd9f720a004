//! ggml tensor types: their block layouts (for bounds checks) and dequantisation to f32 of
//! the ones llama GGUFs are made of: F32, F16, BF16, the 32-value blocks Q4_0, Q4_1, Q5_0,
//! Q5_1 and Q8_0 (here), and the K-quants Q2_K to Q6_K (`kquant`). Layouts follow ggml's
//! `ggml-common.h`; every block is little-endian. A test holds each type to the values
//! llama.cpp's Python package gives for the same bytes (`tools/gguf/quant_golden.py`).

use half::{bf16, f16};

use super::kquant;

/// A ggml tensor type by its on-disk id. Sizes are known for all of these; only some
/// dequantise (see [`dequantize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
    /// An id this reader has no layout for; its tensors can be listed but not read.
    Unknown(u32),
}

impl GgmlType {
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            30 => Self::BF16,
            other => Self::Unknown(other),
        }
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Q8K => 15,
            Self::BF16 => 30,
            Self::Unknown(id) => id,
        }
    }

    /// (elements per block, bytes per block), or `None` for an unknown type.
    pub fn block(self) -> Option<(u64, u64)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q8_1 => (32, 36),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Q8K => (256, 292),
            Self::Unknown(_) => return None,
        })
    }
}

/// Why a byte run could not be dequantised.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("dequantisation of {0:?} is not implemented (supported: {SUPPORTED})")]
    Unsupported(GgmlType),
    #[error("{elements} elements of {ty:?} need {need} bytes, got {got}")]
    Size {
        ty: GgmlType,
        elements: u64,
        need: u64,
        got: usize,
    },
}

/// The types [`dequantize`] reads, for messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, \
                             Q5_K, Q6_K";

/// Whether [`dequantize`] reads `ty` (asked of it: its match is the one list).
pub fn dequantizes(ty: GgmlType) -> bool {
    dequantize(ty, &[], 0).is_ok()
}

/// Dequantises `elements` values of type `ty` stored in `bytes` (exactly their size).
pub fn dequantize(ty: GgmlType, bytes: &[u8], elements: u64) -> Result<Vec<f32>, QuantError> {
    let (per, size) = ty.block().ok_or(QuantError::Unsupported(ty))?;
    let need = elements
        .is_multiple_of(per)
        .then(|| (elements / per).checked_mul(size))
        .flatten();
    if need != Some(bytes.len() as u64) {
        return Err(QuantError::Size {
            ty,
            elements,
            need: need.unwrap_or(u64::MAX),
            got: bytes.len(),
        });
    }
    let mut out = Vec::with_capacity(elements as usize);
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(|b| le_f16(b[0], b[1]))),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        // d: f16, then 32 signed bytes; x = d * q.
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = le_f16(b[0], b[1]);
                out.extend(b[2..].iter().map(|&q| d * f32::from(q as i8)));
            }
        }
        // In the 4- and 5-bit blocks element j < 16 is the low nibble of byte j and element
        // j + 16 its high nibble; a 5-bit block's fifth bits are a little-endian u32 whose
        // bit i is element i's.
        // d: f16, 16 bytes; x = d * (q - 8).
        GgmlType::Q4_0 => {
            for b in bytes.chunks_exact(18) {
                let d = le_f16(b[0], b[1]);
                out.extend(nibbles(&b[2..], 0).map(|q| d * f32::from(q as i8 - 8)));
            }
        }
        // d, m: f16, 16 bytes; x = d * q + m.
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(20) {
                let (d, m) = (le_f16(b[0], b[1]), le_f16(b[2], b[3]));
                out.extend(nibbles(&b[4..], 0).map(|q| d * f32::from(q) + m));
            }
        }
        // d: f16, fifth bits, 16 bytes; x = d * (q - 16).
        GgmlType::Q5_0 => {
            for b in bytes.chunks_exact(22) {
                let d = le_f16(b[0], b[1]);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                out.extend(nibbles(&b[6..], qh).map(|q| d * f32::from(q as i8 - 16)));
            }
        }
        // d, m: f16, fifth bits, 16 bytes; x = d * q + m.
        GgmlType::Q5_1 => {
            for b in bytes.chunks_exact(24) {
                let (d, m) = (le_f16(b[0], b[1]), le_f16(b[2], b[3]));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                out.extend(nibbles(&b[8..], qh).map(|q| d * f32::from(q) + m));
            }
        }
        GgmlType::Q2K => each_block(bytes, size, &mut out, kquant::q2_k),
        GgmlType::Q3K => each_block(bytes, size, &mut out, kquant::q3_k),
        GgmlType::Q4K => each_block(bytes, size, &mut out, kquant::q4_k),
        GgmlType::Q5K => each_block(bytes, size, &mut out, kquant::q5_k),
        GgmlType::Q6K => each_block(bytes, size, &mut out, kquant::q6_k),
        other => return Err(QuantError::Unsupported(other)),
    }
    Ok(out)
}

/// Appends the values of each `size`-byte block of `bytes`, dequantised by `block`.
fn each_block(bytes: &[u8], size: u64, out: &mut Vec<f32>, block: fn(&[u8], &mut Vec<f32>)) {
    for b in bytes.chunks_exact(size as usize) {
        block(b, out);
    }
}

/// The 32 values of a 4-bit block's 16 bytes `qs` in element order (low nibbles, then high
/// ones), each with its fifth bit from `qh` (0 for a 4-bit block).
fn nibbles(qs: &[u8], qh: u32) -> impl Iterator<Item = u8> + '_ {
    let low = qs.iter().map(|&q| q & 0x0f);
    let high = qs.iter().map(|&q| q >> 4);
    low.chain(high)
        .enumerate()
        .map(move |(i, q)| q | ((((qh >> i) & 1) as u8) << 4))
}

fn le_f16(a: u8, b: u8) -> f32 {
    f16::from_le_bytes([a, b]).to_f32()
}

/// The golden file's (type, bytes, values) records: seeded blocks of each quantised type and
/// llama.cpp's values for them (`tools/gguf/quant_golden.py`).
#[cfg(test)]
pub(crate) fn golden() -> Vec<(GgmlType, Vec<u8>, Vec<f32>)> {
    let raw = include_bytes!("../../tests/fixtures/gguf/quant_golden.bin");
    let mut rest = raw.strip_prefix(b"GQGOLD1\n").expect("golden header");
    let u32_at = |r: &mut &[u8]| {
        let (h, t) = r.split_at(4);
        *r = t;
        u32::from_le_bytes([h[0], h[1], h[2], h[3]])
    };
    let mut out = Vec::new();
    while !rest.is_empty() {
        let ty = GgmlType::from_id(u32_at(&mut rest));
        let (n, nb) = (u32_at(&mut rest) as usize, u32_at(&mut rest) as usize);
        let (bytes, t) = rest.split_at(nb);
        let (vals, t) = t.split_at(4 * n);
        rest = t;
        let vals = vals
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push((ty, bytes.to_vec(), vals));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_block_is_scale_times_signed_byte() {
        let mut b = f16_bytes(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let x = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!(x[0], -8.0);
        assert_eq!(x[16], 0.0);
        assert_eq!(x[31], 7.5);
    }

    #[test]
    fn q4_1_block_puts_low_nibbles_first_then_high_nibbles_plus_min() {
        let mut b = f16_bytes(0.25).to_vec();
        b.extend(f16_bytes(-1.0));
        // Byte j holds j in its low nibble and 15 - j in its high nibble.
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        assert_eq!(x[0], -1.0); // 0 * 0.25 - 1
        assert_eq!(x[3], -0.25); // 3 * 0.25 - 1
        assert_eq!(x[15], 2.75); // 15 * 0.25 - 1
        assert_eq!(x[16], 2.75); // high nibble of byte 0 is 15
        assert_eq!(x[31], -1.0); // high nibble of byte 15 is 0
    }

    #[test]
    fn f16_bf16_and_f32_convert_exactly() {
        let h: Vec<u8> = [1.5f32, -0.125]
            .iter()
            .flat_map(|&v| f16_bytes(v))
            .collect();
        assert_eq!(dequantize(GgmlType::F16, &h, 2).unwrap(), [1.5, -0.125]);
        let b: Vec<u8> = [3.0f32, -2.5]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(dequantize(GgmlType::BF16, &b, 2).unwrap(), [3.0, -2.5]);
        let f: Vec<u8> = [1e-7f32, 42.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(dequantize(GgmlType::F32, &f, 2).unwrap(), [1e-7, 42.0]);
    }

    #[test]
    fn wrong_byte_count_and_partial_blocks_are_errors() {
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 33], 32),
            Err(QuantError::Size { need: 34, .. })
        ));
        // 31 elements cannot fill a block of 32.
        assert!(matches!(
            dequantize(GgmlType::Q4_1, &[0; 20], 31),
            Err(QuantError::Size { .. })
        ));
        assert_eq!(
            dequantize(GgmlType::Q8K, &[0; 292], 256),
            Err(QuantError::Unsupported(GgmlType::Q8K))
        );
        // A K-quant tensor is whole super-blocks of 256.
        assert!(matches!(
            dequantize(GgmlType::Q4K, &[0; 144], 128),
            Err(QuantError::Size { .. })
        ));
        assert_eq!(
            dequantize(GgmlType::Unknown(99), &[], 0),
            Err(QuantError::Unsupported(GgmlType::Unknown(99)))
        );
    }

    #[test]
    fn every_quantised_type_dequantises_to_llama_cpps_values_bit_for_bit() {
        let cases = golden();
        let types: Vec<GgmlType> = cases.iter().map(|c| c.0).collect();
        use GgmlType::*;
        assert_eq!(
            types,
            [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K],
            "the golden file covers each quantised type the reader claims"
        );
        for (ty, bytes, want) in cases {
            assert!(dequantizes(ty));
            let got = dequantize(ty, &bytes, want.len() as u64).unwrap();
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{ty:?} element {i}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn the_supported_list_names_exactly_the_types_that_dequantise() {
        let named: Vec<String> = (0..40)
            .map(GgmlType::from_id)
            .filter(|&ty| dequantizes(ty))
            .map(|ty| {
                let n = format!("{ty:?}");
                // ggml writes the K-quants Q4_K; the enum spells them Q4K.
                n.strip_suffix('K').map_or(n.clone(), |s| format!("{s}_K"))
            })
            .collect();
        let listed: Vec<&str> = SUPPORTED.split(", ").collect();
        assert_eq!(named.len(), listed.len(), "{named:?} vs {listed:?}");
        for n in &named {
            assert!(
                listed.contains(&n.as_str()),
                "{n} is missing from SUPPORTED"
            );
        }
        assert!(!dequantizes(GgmlType::Q8K) && !dequantizes(GgmlType::Unknown(99)));
    }

    #[test]
    fn type_ids_round_trip() {
        for id in 0..40 {
            assert_eq!(GgmlType::from_id(id).id(), id);
        }
    }
}

//! The GGUF container (versions 2 and 3, little-endian): header, metadata, tensor infos,
//! alignment and the data section. The whole file is read into memory and every count and
//! offset is checked against its length, so a truncated or corrupt file is an error that
//! names the file and the byte offset, never a panic.

use std::path::Path;

use super::quant::{dequantize, GgmlType};
use super::value::Value;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal; deeper nesting than this is taken for corruption.
const MAX_NESTING: usize = 4;

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: byte {offset}: {msg}")]
    Format {
        path: String,
        offset: u64,
        msg: String,
    },
    #[error("{path}: metadata {key:?}: {msg}")]
    Metadata {
        path: String,
        key: String,
        msg: String,
    },
    #[error("{path}: tensor {name:?}: {msg}")]
    Tensor {
        path: String,
        name: String,
        msg: String,
    },
}

/// One tensor's header entry. `dims` are in GGUF order (fastest-varying first), the reverse
/// of numpy's: a linear weight of numpy shape (out, in) has `dims == [in, out]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes the tensor occupies, or `None` for a type without a known layout.
    pub fn byte_len(&self) -> Option<u64> {
        self.ty
            .block()
            .map(|(per, size)| self.elements() / per * size)
    }
}

/// A parsed GGUF file with its bytes.
#[derive(Debug)]
pub struct Gguf {
    path: String,
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
    bytes: Vec<u8>,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: name.clone(),
            source,
        })?;
        Self::parse(bytes, &name)
    }

    /// Parses a whole file held in memory; `source` names it in errors.
    pub fn parse(bytes: Vec<u8>, source: &str) -> Result<Self, GgufError> {
        let mut c = Cursor {
            bytes: &bytes,
            pos: 0,
            path: source,
        };
        let magic = c.take(4, "magic")?;
        if magic != MAGIC {
            return Err(c.err_at(0, format!("not a GGUF file (magic {magic:02x?})")));
        }
        let version = c.u32()?;
        match version {
            2 | 3 => {}
            1 => return Err(c.err_at(4, "GGUF version 1 is not supported".into())),
            v if v.swap_bytes() <= 3 => {
                return Err(c.err_at(4, "big-endian GGUF is not supported".into()))
            }
            v => return Err(c.err_at(4, format!("unknown GGUF version {v}"))),
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        // Each key-value pair needs at least 12 bytes and each tensor info 24.
        c.check_count(n_kv, 12, "metadata entries")?;
        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let at = c.pos;
            let key = c.string()?;
            if metadata.iter().any(|(k, _)| *k == key) {
                return Err(c.err_at(at, format!("duplicate metadata key {key:?}")));
            }
            let ty_at = c.pos;
            let ty = c.u32()?;
            if ty > 12 {
                return Err(c.err_at(ty_at, format!("unknown metadata value type {ty}")));
            }
            let value = c.value(ty, 0)?;
            metadata.push((key, value));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(GgufError::Metadata {
                    path: source.into(),
                    key: "general.alignment".into(),
                    msg: format!("must be a u32 power of two, got {v:?}"),
                })
            }
        };
        c.check_count(n_tensors, 24, "tensor infos")?;
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let at = c.pos;
            let name = c.string()?;
            if tensors.iter().any(|t| t.name == name) {
                return Err(c.err_at(at, format!("duplicate tensor {name:?}")));
            }
            let n_dims = c.u32()?;
            if n_dims > MAX_DIMS {
                return Err(c.err_at(at, format!("tensor {name:?} has {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| c.u64())
                .collect::<Result<Vec<_>, _>>()?;
            let ty = GgmlType::from_id(c.u32()?);
            let offset = c.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        let data_offset = c.pos.next_multiple_of(alignment);
        let data_len = (bytes.len() as u64).saturating_sub(data_offset);
        for t in &tensors {
            check_tensor(t, alignment, data_len).map_err(|msg| GgufError::Tensor {
                path: source.into(),
                name: t.name.clone(),
                msg,
            })?;
        }
        Ok(Gguf {
            path: source.into(),
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            bytes,
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor of known layout (bounds were checked at parse time).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Option<&[u8]> {
        let start = self.data_offset + t.offset;
        let end = start + t.byte_len()?;
        self.bytes.get(start as usize..end as usize)
    }

    /// A tensor dequantised to f32, in file order (GGUF dim 0 fastest, i.e. numpy row-major).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let err = |msg: String| GgufError::Tensor {
            path: self.path.clone(),
            name: name.into(),
            msg,
        };
        let t = self
            .tensor(name)
            .ok_or_else(|| err("not in the file".into()))?;
        let bytes = self
            .tensor_bytes(t)
            .ok_or_else(|| err(format!("type {:?} has no known layout", t.ty)))?;
        dequantize(t.ty, bytes, t.elements()).map_err(|e| err(e.to_string()))
    }

    fn meta_err(&self, key: &str, msg: String) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.into(),
            msg,
        }
    }

    fn required(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| self.meta_err(key, "missing".into()))
    }

    /// A non-negative integer of any width.
    pub fn meta_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.required(key)?;
        v.as_u64()
            .ok_or_else(|| self.meta_err(key, format!("expected an unsigned integer, got {v:?}")))
    }

    pub fn meta_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.required(key)?;
        v.as_f64()
            .ok_or_else(|| self.meta_err(key, format!("expected a float, got {v:?}")))
    }

    pub fn meta_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| {
            self.meta_err(key, format!("expected a string, got type {}", v.type_id()))
        })
    }

    /// An array of strings.
    pub fn meta_strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.required(key)?;
        v.as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.meta_err(key, "expected an array of strings".into()))
    }

    /// An array of integers of any width.
    pub fn meta_ints(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.required(key)?;
        v.as_array()
            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.meta_err(key, "expected an array of integers".into()))
    }
}

fn check_tensor(t: &TensorInfo, alignment: u64, data_len: u64) -> Result<(), String> {
    let elements = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("dimensions {:?} overflow", t.dims))?;
    if !t.offset.is_multiple_of(alignment) {
        return Err(format!(
            "data offset {} is not a multiple of the alignment {alignment}",
            t.offset
        ));
    }
    let Some((per, size)) = t.ty.block() else {
        return Ok(()); // unknown layout: listed, never read
    };
    let row = t.dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(per) {
        return Err(format!(
            "first dimension {row} is not a multiple of the {:?} block of {per}",
            t.ty
        ));
    }
    let len = (elements / per)
        .checked_mul(size)
        .ok_or_else(|| "byte size overflows".to_string())?;
    match t.offset.checked_add(len) {
        Some(end) if end <= data_len => Ok(()),
        _ => Err(format!(
            "data [{}, +{len}) runs past the end of the data section ({data_len} bytes; file truncated?)",
            t.offset
        )),
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: u64,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    fn err_at(&self, offset: u64, msg: String) -> GgufError {
        GgufError::Format {
            path: self.path.into(),
            offset,
            msg,
        }
    }

    fn remaining(&self) -> u64 {
        self.bytes.len() as u64 - self.pos
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err_at(
                self.pos,
                format!(
                    "{what}: need {n} bytes, {} left (file truncated?)",
                    self.remaining()
                ),
            ));
        }
        let bytes: &'a [u8] = self.bytes;
        let s = &bytes[self.pos as usize..(self.pos + n) as usize];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        self.array("u32").map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        self.array("u64").map(u64::from_le_bytes)
    }

    /// Rejects counts that could not fit in the rest of the file before allocating for them.
    fn check_count(&self, n: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
        if n.saturating_mul(min_size) > self.remaining() {
            return Err(self.err_at(
                self.pos,
                format!(
                    "{n} {what} cannot fit in the {} bytes left (file truncated?)",
                    self.remaining()
                ),
            ));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let at = self.pos;
        let n = self.u64()?;
        let s = self.take(n, "string")?;
        String::from_utf8(s.to_vec())
            .map_err(|e| self.err_at(at, format!("string is not UTF-8: {e}")))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, GgufError> {
        let at = self.pos;
        Ok(match ty {
            0 => Value::U8(self.array::<1>("u8")?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array("i8")?)),
            2 => Value::U16(u16::from_le_bytes(self.array("u16")?)),
            3 => Value::I16(i16::from_le_bytes(self.array("i16")?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array("i32")?)),
            6 => Value::F32(f32::from_le_bytes(self.array("f32")?)),
            7 => match self.array::<1>("bool")?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err_at(at, format!("bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.err_at(at, "arrays nested too deeply".into()));
                }
                let elem = self.u32()?;
                if elem > 12 {
                    return Err(self.err_at(at, format!("unknown array element type {elem}")));
                }
                let n = self.u64()?;
                self.check_count(n, min_value_size(elem), "array elements")?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                Value::Array(elem, v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            12 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
            other => return Err(self.err_at(at, format!("unknown metadata value type {other}"))),
        })
    }
}

/// The fewest bytes one value of type `ty` occupies.
fn min_value_size(ty: u32) -> u64 {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,  // length prefix
        9 => 12, // element type + count
        _ => 8,  // 64-bit types; unknown types fail on the first element
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::gguf::testfile::{strings, GgufBuilder};

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    /// One tensor of each readable quant type, metadata of every value type.
    fn sample() -> GgufBuilder {
        let mut q8 = h(2.0).to_vec();
        q8.extend((0..32).map(|i: i8| (i - 3) as u8));
        let mut q4 = h(0.5).to_vec();
        q4.extend(h(1.0));
        q4.extend((0..16u8).map(|j| (j & 0x0f) | (0x0a << 4)));
        GgufBuilder::default()
            .kv("general.alignment", Value::U32(64))
            .kv("u8", Value::U8(200))
            .kv("i8", Value::I8(-5))
            .kv("u16", Value::U16(60_000))
            .kv("i16", Value::I16(-30_000))
            .kv("u32", Value::U32(4_000_000_000))
            .kv("i32", Value::I32(-2_000_000_000))
            .kv("f32", Value::F32(0.25))
            .kv("bool", Value::Bool(true))
            .kv("str", Value::String("héllo".into()))
            .kv("u64", Value::U64(1 << 40))
            .kv("i64", Value::I64(-(1 << 40)))
            .kv("f64", Value::F64(1e-300))
            .kv("tokens", strings(&["a", "b c", ""]))
            .kv(
                "nested",
                Value::Array(
                    9,
                    vec![
                        Value::Array(5, vec![Value::I32(1), Value::I32(-2)]),
                        Value::Array(5, vec![]),
                    ],
                ),
            )
            .f32_tensor("norm", &[3], &[1.0, -2.0, 0.5])
            .tensor(
                "half",
                &[2, 2],
                GgmlType::F16,
                [0.5f32, 1.0, -1.5, 2.0]
                    .iter()
                    .flat_map(|&v| h(v))
                    .collect(),
            )
            .tensor("q8", &[32], GgmlType::Q8_0, q8)
            .tensor("q4", &[32, 1], GgmlType::Q4_1, q4)
    }

    fn parse(b: Vec<u8>) -> Result<Gguf, GgufError> {
        Gguf::parse(b, "mem.gguf")
    }

    #[test]
    fn metadata_of_every_value_type_reads_back() {
        let g = parse(sample().build()).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.metadata().len(), 15);
        assert_eq!(g.meta_u64("u8").unwrap(), 200);
        assert_eq!(g.get("i8"), Some(&Value::I8(-5)));
        assert_eq!(g.meta_u64("u16").unwrap(), 60_000);
        assert_eq!(g.get("i16").and_then(Value::as_i64), Some(-30_000));
        assert_eq!(g.meta_u64("u32").unwrap(), 4_000_000_000);
        assert_eq!(g.get("i32").and_then(Value::as_i64), Some(-2_000_000_000));
        assert_eq!(g.meta_f64("f32").unwrap(), 0.25);
        assert_eq!(g.get("bool"), Some(&Value::Bool(true)));
        assert_eq!(g.meta_str("str").unwrap(), "héllo");
        assert_eq!(g.meta_u64("u64").unwrap(), 1 << 40);
        assert_eq!(g.get("i64").and_then(Value::as_i64), Some(-(1 << 40)));
        assert_eq!(g.meta_f64("f64").unwrap(), 1e-300);
        assert_eq!(g.meta_strings("tokens").unwrap(), ["a", "b c", ""]);
        let nested = g.get("nested").and_then(Value::as_array).unwrap();
        assert_eq!(
            nested[0],
            Value::Array(5, vec![Value::I32(1), Value::I32(-2)])
        );
        assert_eq!(nested[1].as_array().map(<[Value]>::len), Some(0));
        // Negative values are not unsigned; wrong types name the key.
        assert!(g.meta_u64("i8").is_err());
        let e = g.meta_str("u8").unwrap_err().to_string();
        assert!(e.contains("mem.gguf") && e.contains("\"u8\""), "{e}");
        assert!(g
            .meta_u64("absent")
            .unwrap_err()
            .to_string()
            .contains("missing"));
    }

    #[test]
    fn tensors_sit_at_aligned_offsets_and_dequantise_to_hand_computed_values() {
        let g = parse(sample().build()).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() % 64, 0);
        assert!(g.tensors().iter().all(|t| t.offset % 64 == 0));
        let half = g.tensor("half").unwrap();
        assert_eq!((half.dims.clone(), half.elements()), (vec![2, 2], 4));
        assert_eq!(g.tensor_f32("norm").unwrap(), [1.0, -2.0, 0.5]);
        assert_eq!(g.tensor_f32("half").unwrap(), [0.5, 1.0, -1.5, 2.0]);
        let q8 = g.tensor_f32("q8").unwrap();
        assert_eq!((q8[0], q8[3], q8[31]), (-6.0, 0.0, 56.0)); // 2 * (i - 3)
        let q4 = g.tensor_f32("q4").unwrap();
        // Low nibble j: 0.5 * j + 1; every high nibble is 10: 0.5 * 10 + 1.
        assert_eq!((q4[0], q4[7], q4[15]), (1.0, 4.5, 8.5));
        assert!(q4[16..].iter().all(|&x| x == 6.0));
        let e = g.tensor_f32("nope").unwrap_err().to_string();
        assert!(
            e.contains("\"nope\"") && e.contains("not in the file"),
            "{e}"
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let b = sample().build();
        for n in 0..b.len() {
            assert!(
                parse(b[..n].to_vec()).is_err(),
                "prefix of {n} bytes parsed"
            );
        }
        let e = parse(b[..40].to_vec()).unwrap_err().to_string();
        assert!(
            e.starts_with("mem.gguf: byte ") && e.contains("truncated"),
            "{e}"
        );
        let e = parse(b[..b.len() - 1].to_vec()).unwrap_err().to_string();
        assert!(e.contains("\"q4\"") && e.contains("past the end"), "{e}");
    }

    #[test]
    fn corrupt_headers_are_errors_that_name_the_problem() {
        let err = |b: Vec<u8>| parse(b).unwrap_err().to_string();
        let good = sample().build();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(err(b).contains("not a GGUF file"));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(err(b).contains("version 1"));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(err(b).contains("big-endian"));
        // A metadata count no file could hold fails before any allocation.
        let mut b = good.clone();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(b).contains("metadata entries cannot fit"));
        // The first value type ("general.alignment" is u32 = 4) set to 77.
        let type_at = 24 + 8 + "general.alignment".len();
        let mut b = good.clone();
        b[type_at..type_at + 4].copy_from_slice(&77u32.to_le_bytes());
        assert!(err(b).contains(&format!("byte {type_at}: unknown metadata value type 77")));
        let one = |k: &str, v: Value| err(GgufBuilder::default().kv(k, v).build());
        assert!(one("general.alignment", Value::U32(48)).contains("power of two"));
        assert!(one("general.alignment", Value::U64(64)).contains("power of two"));
        let dup = GgufBuilder::default()
            .kv("a", Value::U8(1))
            .kv("a", Value::U8(2))
            .build();
        assert!(err(dup).contains("duplicate metadata key"));
        let mut b = GgufBuilder::default().kv("b", Value::Bool(true)).build();
        let last = b.len() - 1;
        b[last] = 2;
        assert!(err(b).contains("neither 0 nor 1"));
    }

    #[test]
    fn bad_tensor_infos_are_errors() {
        let err = |g: GgufBuilder| parse(g.build()).unwrap_err().to_string();
        let partial = GgufBuilder::default().tensor("t", &[31], GgmlType::Q8_0, vec![0; 34]);
        assert!(err(partial).contains("not a multiple of the Q8_0 block"));
        let five = GgufBuilder::default().f32_tensor("t", &[1, 1, 1, 1, 1], &[0.0]);
        assert!(err(five).contains("5 dimensions"));
        let dup = GgufBuilder::default()
            .f32_tensor("t", &[1], &[0.0])
            .f32_tensor("t", &[1], &[0.0]);
        assert!(err(dup).contains("duplicate tensor"));
        // A misaligned offset: patch the only tensor's offset field (the header's last 8
        // bytes before the padding).
        let mut b = GgufBuilder::default().f32_tensor("t", &[1], &[0.0]).build();
        let off_at = 24 + 8 + 1 + 4 + 8 + 4;
        b[off_at..off_at + 8].copy_from_slice(&4u64.to_le_bytes());
        assert!(parse(b)
            .unwrap_err()
            .to_string()
            .contains("not a multiple of the alignment"));
        // Unknown types are listed but cannot be read.
        let g = parse(
            GgufBuilder::default()
                .tensor("iq", &[256], GgmlType::Unknown(23), vec![0; 64])
                .build(),
        )
        .unwrap();
        assert!(g
            .tensor_f32("iq")
            .unwrap_err()
            .to_string()
            .contains("no known layout"));
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let e = Gguf::open(Path::new("no/such/model.gguf"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("no/such/model.gguf: cannot read"), "{e}");
    }
}

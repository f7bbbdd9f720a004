//! A small reader for safetensors checkpoints (8-byte little-endian header length, a JSON
//! header of name -> {dtype, shape, data_offsets}, then raw little-endian data). Only what a
//! Llama checkpoint needs: BF16, F16 and F32 tensors, one or several files in a directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::init::{bf16_bits_to_f32, f32_to_bf16_bits};

#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("{path}: {msg}")]
    Bad { path: String, msg: String },
    #[error("tensor {name:?} not found in {dir}")]
    Missing { name: String, dir: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    end: usize,
}

/// Every tensor of the `*.safetensors` files of a directory (or of one file).
pub struct Checkpoint {
    dir: String,
    files: Vec<Vec<u8>>,
    tensors: BTreeMap<String, TensorInfo>,
}

impl Checkpoint {
    /// Opens a directory (all its `*.safetensors` files, sorted by name) or a single file.
    pub fn open(path: &Path) -> Result<Self, SafetensorsError> {
        let bad = |p: &Path, msg: String| SafetensorsError::Bad {
            path: p.display().to_string(),
            msg,
        };
        let paths: Vec<PathBuf> = if path.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| bad(path, format!("cannot list: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            if v.is_empty() {
                return Err(bad(path, "no *.safetensors file".into()));
            }
            v
        } else {
            vec![path.to_path_buf()]
        };
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        for (fi, p) in paths.iter().enumerate() {
            let data = std::fs::read(p).map_err(|e| bad(p, format!("cannot read: {e}")))?;
            for (name, info) in parse_header(&data, fi).map_err(|m| bad(p, m))? {
                tensors.insert(name, info);
            }
            files.push(data);
        }
        Ok(Checkpoint {
            dir: path.display().to_string(),
            files,
            tensors,
        })
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    fn raw(&self, name: &str) -> Result<(&TensorInfo, &[u8]), SafetensorsError> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| SafetensorsError::Missing {
                name: name.to_string(),
                dir: self.dir.clone(),
            })?;
        Ok((info, &self.files[info.file][info.start..info.end]))
    }

    /// The tensor as bf16 bits (F32 and F16 are rounded to nearest even).
    pub fn bf16_bits(&self, name: &str) -> Result<Vec<u16>, SafetensorsError> {
        let (info, b) = self.raw(name)?;
        Ok(match info.dtype {
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
            _ => self.f32(name)?.into_iter().map(f32_to_bf16_bits).collect(),
        })
    }

    /// The tensor as f32 values.
    pub fn f32(&self, name: &str) -> Result<Vec<f32>, SafetensorsError> {
        let (info, b) = self.raw(name)?;
        Ok(match info.dtype {
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }
}

fn parse_header(data: &[u8], file: usize) -> Result<Vec<(String, TensorInfo)>, String> {
    if data.len() < 8 {
        return Err(format!(
            "{} bytes: too short for a safetensors header",
            data.len()
        ));
    }
    let n = u64::from_le_bytes(
        data[..8]
            .try_into()
            .map_err(|_| "short header".to_string())?,
    );
    let body_start = 8usize
        .checked_add(n as usize)
        .filter(|&e| e <= data.len())
        .ok_or_else(|| {
            format!(
                "header length {n} runs past the end of the file ({} bytes)",
                data.len()
            )
        })?;
    let v: Value = serde_json::from_slice(&data[8..body_start])
        .map_err(|e| format!("header JSON line {} column {}: {e}", e.line(), e.column()))?;
    let obj = v.as_object().ok_or("header is not a JSON object")?;
    let body = data.len() - body_start;
    let mut out = Vec::new();
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let field = |k: &str| {
            t.get(k)
                .ok_or_else(|| format!("tensor {name:?}: missing {k:?}"))
        };
        let dtype = match field("dtype")?.as_str() {
            Some("BF16") => DType::BF16,
            Some("F16") => DType::F16,
            Some("F32") => DType::F32,
            other => return Err(format!("tensor {name:?}: unsupported dtype {other:?}")),
        };
        let nums = |k: &str| -> Result<Vec<usize>, String> {
            field(k)?
                .as_array()
                .ok_or_else(|| format!("tensor {name:?}: {k:?} is not an array"))?
                .iter()
                .map(|x| x.as_u64().map(|x| x as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("tensor {name:?}: {k:?} holds a non-integer"))
        };
        let shape = nums("shape")?;
        let off = nums("data_offsets")?;
        let (s, e) = match off[..] {
            [s, e] if s <= e && e <= body => (s, e),
            _ => {
                return Err(format!(
                    "tensor {name:?}: data_offsets {off:?} outside {body} data bytes"
                ))
            }
        };
        let elems: usize = shape.iter().product();
        if elems * dtype.size() != e - s {
            return Err(format!(
                "tensor {name:?}: shape {shape:?} needs {} bytes, offsets give {}",
                elems * dtype.size(),
                e - s
            ));
        }
        out.push((
            name.clone(),
            TensorInfo {
                dtype,
                shape,
                file,
                start: body_start + s,
                end: body_start + e,
            },
        ));
    }
    Ok(out)
}

/// Writes bf16 tensors to a safetensors file (used by tests and tools).
pub fn write_bf16(path: &Path, tensors: &[(String, Vec<usize>, Vec<u16>)]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, shape, data) in tensors {
        let end = off + data.len() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [off, end]}),
        );
        off = end;
    }
    let mut h = serde_json::to_vec(&Value::Object(header))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + off);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for (_, _, data) in tensors {
        data.iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    }
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_bf16_tensors_read_back_identically() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        let a: Vec<u16> = (0..6)
            .map(|i| f32_to_bf16_bits(i as f32 * 0.5 - 1.0))
            .collect();
        write_bf16(
            &p,
            &[
                ("a".into(), vec![2, 3], a.clone()),
                ("b".into(), vec![1], vec![0x3f80]),
            ],
        )
        .unwrap();
        let c = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(c.bf16_bits("a").unwrap(), a);
        assert_eq!(c.info("a").unwrap().shape, vec![2, 3]);
        assert_eq!(c.f32("b").unwrap(), vec![1.0]);
        assert!(matches!(
            c.f32("zzz"),
            Err(SafetensorsError::Missing { .. })
        ));
    }

    #[test]
    fn truncated_and_garbage_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.safetensors");
        std::fs::write(&p, [1u8, 2, 3]).unwrap();
        let e = Checkpoint::open(&p).err().unwrap().to_string();
        assert!(
            e.contains("x.safetensors") && e.contains("too short"),
            "{e}"
        );
        let mut bytes = 1000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&p, &bytes).unwrap();
        assert!(Checkpoint::open(&p)
            .err()
            .unwrap()
            .to_string()
            .contains("runs past"));
        let h = br#"{"t":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}"#;
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(h);
        bytes.extend_from_slice(&[0u8; 4]);
        std::fs::write(&p, &bytes).unwrap();
        assert!(Checkpoint::open(&p)
            .err()
            .unwrap()
            .to_string()
            .contains("outside 4 data bytes"));
    }
}

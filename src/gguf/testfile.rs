//! A GGUF v3 writer for building small files in tests (bytes built in code).

use super::quant::GgmlType;
use super::value::Value;

#[derive(Default)]
pub(crate) struct GgufBuilder {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufBuilder {
    pub(crate) fn kv(mut self, key: &str, v: Value) -> Self {
        self.kv.push((key.into(), v));
        self
    }

    /// `dims` in GGUF order (fastest first); `data` already encoded in `ty`.
    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }

    pub(crate) fn f32_tensor(self, name: &str, dims: &[u64], data: &[f32]) -> Self {
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, GgmlType::F32, bytes)
    }

    pub(crate) fn build(&self) -> Vec<u8> {
        let align = match self.kv.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => u64::from(*a),
            _ => 32,
        };
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.id().to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).next_multiple_of(align);
        }
        let base = (out.len() as u64).next_multiple_of(align);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((base + off) as usize, 0);
            out.extend(data);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(ty, items) => {
            out.extend(ty.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Strings as a GGUF array value.
pub(crate) fn strings(items: &[&str]) -> Value {
    Value::Array(
        8,
        items.iter().map(|s| Value::String((*s).into())).collect(),
    )
}

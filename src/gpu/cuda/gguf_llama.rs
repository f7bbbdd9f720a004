//! A Llama-architecture GGUF file (e.g. SmolLM2) as the f32 CPU reference model: the shape
//! from `llama.*` metadata, tensors by their GGUF names, dequantised to f32. llama.cpp's
//! converter permutes Q and K rows so that RoPE rotates interleaved pairs, so the model
//! it returns uses `RopeLayout::Interleaved`.

use super::cpu_ref::{CpuLoadError, CpuModel, RopeLayout};
use super::init::Tensor;
use super::shape::RopeScaling;
use super::ModelShape;
use crate::gguf::{Gguf, GgufError};

/// Why a GGUF file is not a Llama model the CPU reference can run.
#[derive(Debug, thiserror::Error)]
pub enum LlamaGgufError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: {msg}")]
    Unsupported { path: String, msg: String },
    #[error("{path}: {source}")]
    Load {
        path: String,
        #[source]
        source: CpuLoadError,
    },
}

/// The GGUF name of a model tensor.
pub fn gguf_name(t: Tensor) -> String {
    let b = |i: usize, n: &str| format!("blk.{i}.{n}.weight");
    match t {
        Tensor::Embed => "token_embd.weight".into(),
        Tensor::AttnNorm(i) => b(i, "attn_norm"),
        Tensor::Q(i) => b(i, "attn_q"),
        Tensor::K(i) => b(i, "attn_k"),
        Tensor::V(i) => b(i, "attn_v"),
        Tensor::O(i) => b(i, "attn_output"),
        Tensor::FfnNorm(i) => b(i, "ffn_norm"),
        Tensor::Gate(i) => b(i, "ffn_gate"),
        Tensor::Up(i) => b(i, "ffn_up"),
        Tensor::Down(i) => b(i, "ffn_down"),
        // Our hybrid layers' decay (no GGUF model has them; named for completeness).
        Tensor::Decay(i) => b(i, "ssm_decay"),
        Tensor::DecayBias(i) => format!("blk.{i}.ssm_decay.bias"),
        Tensor::FinalNorm => "output_norm.weight".into(),
        Tensor::LmHead => "output.weight".into(),
    }
}

/// The model's dimensions from `general.architecture = "llama"` metadata. No `output.weight`
/// means the LM head is tied to `token_embd`; `rope_freqs.weight` holds RoPE frequency
/// divisors. Only the limits of the CPU reference are checked, not those of the CUDA kernels.
pub fn shape_from_gguf(g: &Gguf) -> Result<ModelShape, LlamaGgufError> {
    let bad = |msg: String| LlamaGgufError::Unsupported {
        path: g.path().into(),
        msg,
    };
    let arch = g.meta_str("general.architecture")?;
    if arch != "llama" {
        return Err(bad(format!(
            "architecture {arch:?} is not supported (only llama)"
        )));
    }
    let int = |k: &str| g.meta_u64(&format!("llama.{k}")).map(|v| v as usize);
    let mut rope_scaling = match g.get("llama.rope.scaling.type") {
        None => RopeScaling::None,
        Some(v) => match v.as_str() {
            Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: g.meta_f64("llama.rope.scaling.factor")? as f32,
            },
            _ => {
                return Err(bad(format!(
                    "RoPE scaling {v:?} is not supported (supported: none, linear, and \
                     rope_freqs.weight factors)"
                )))
            }
        },
    };
    // llama.cpp's converter writes Llama 3.1's scaling as per-frequency divisors.
    if g.tensor("rope_freqs.weight").is_some() {
        rope_scaling = RopeScaling::Factors(g.tensor_f32("rope_freqs.weight")?);
    }
    let hidden = int("embedding_length")?;
    let heads = int("attention.head_count")?;
    let kv_heads = match g.get("llama.attention.head_count_kv") {
        Some(_) => int("attention.head_count_kv")?,
        None => heads,
    };
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(bad(format!("{heads} heads over {kv_heads} kv heads")));
    }
    let head_dim = match g.get("llama.attention.key_length") {
        Some(_) => int("attention.key_length")?,
        None => hidden / heads,
    };
    if head_dim == 0 || head_dim % 2 == 1 {
        return Err(bad(format!("head_dim {head_dim} must be even")));
    }
    if let Some(v) = g.get("llama.rope.dimension_count") {
        if v.as_u64() != Some(head_dim as u64) {
            return Err(bad(format!(
                "RoPE over {v:?} of {head_dim} head dimensions is not supported (all of them only)"
            )));
        }
    }
    let embd = g
        .tensor("token_embd.weight")
        .ok_or_else(|| bad("no token_embd.weight".into()))?;
    let vocab = match embd.dims[..] {
        [h, v] if h as usize == hidden => v as usize,
        ref d => {
            return Err(bad(format!(
                "token_embd.weight has dims {d:?}, expected [{hidden}, vocab]"
            )))
        }
    };
    let theta = match g.get("llama.rope.freq_base") {
        Some(_) => g.meta_f64("llama.rope.freq_base")?,
        None => 10_000.0,
    };
    let shape = ModelShape {
        name: g
            .get("general.name")
            .and_then(|v| v.as_str())
            .unwrap_or("gguf")
            .to_string(),
        vocab,
        hidden,
        layers: int("block_count")?,
        heads,
        kv_heads,
        head_dim,
        ffn: int("feed_forward_length")?,
        rope_theta: theta as f32,
        rope_scaling,
        rms_eps: g.meta_f64("llama.attention.layer_norm_rms_epsilon")? as f32,
        tied_embeddings: g.tensor("output.weight").is_none(),
        mix: Default::default(),
    };
    if shape.layers == 0 || shape.ffn == 0 {
        return Err(bad("block_count and feed_forward_length must be > 0".into()));
    }
    Ok(shape)
}

/// The whole model dequantised to f32 (about 4 bytes per parameter), interleaved RoPE.
pub fn load_cpu_model(g: &Gguf) -> Result<CpuModel, LlamaGgufError> {
    let shape = shape_from_gguf(g)?;
    let m = CpuModel::try_from_fn(&shape, |t| {
        let name = gguf_name(t);
        let info = g.tensor(&name).ok_or_else(|| GgufError::Tensor {
            path: g.path().into(),
            name: name.clone(),
            msg: "not in the file".into(),
        })?;
        // GGUF lists dims fastest first: numpy's (rows, cols) read backwards.
        let (rows, cols) = t.dims(&shape);
        let want: Vec<u64> = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        if info.dims != want {
            return Err(GgufError::Tensor {
                path: g.path().into(),
                name,
                msg: format!("dims {:?}, the shape needs {want:?}", info.dims),
            });
        }
        g.tensor_f32(&name)
    })
    .map_err(|e| match e {
        // Errors of the file already name it and the tensor.
        CpuLoadError::Source { source, tensor } => match source.downcast::<GgufError>() {
            Ok(ge) => LlamaGgufError::Gguf(*ge),
            Err(source) => LlamaGgufError::Load {
                path: g.path().into(),
                source: CpuLoadError::Source { tensor, source },
            },
        },
        e => LlamaGgufError::Load {
            path: g.path().into(),
            source: e,
        },
    })?;
    Ok(m.with_rope(RopeLayout::Interleaved))
}

/// Writing llama GGUFs in tests, as llama.cpp's converter writes them.
#[cfg(test)]
pub(crate) mod test_support {
    use crate::gguf::testfile::GgufBuilder;
    use crate::gguf::Value;
    use crate::gpu::cuda::ModelShape;

    /// A llama GGUF's metadata for shape `s` (no tensors yet).
    pub fn llama_header(s: &ModelShape) -> GgufBuilder {
        let u = |v: usize| Value::U32(v as u32);
        GgufBuilder::default()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("llama.embedding_length", u(s.hidden))
            .kv("llama.block_count", u(s.layers))
            .kv("llama.feed_forward_length", u(s.ffn))
            .kv("llama.attention.head_count", u(s.heads))
            .kv("llama.attention.head_count_kv", u(s.kv_heads))
            .kv("llama.attention.key_length", u(s.head_dim))
            .kv("llama.rope.freq_base", Value::F32(s.rope_theta))
            .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
    }

    /// llama.cpp's converter reorders each Q/K head's rows so that HF pair (j, j + D/2)
    /// lands on (2j, 2j + 1): row 2j + t of the GGUF head is HF row t * D/2 + j (the inverse
    /// of `model_files::unpermute_rows`).
    pub fn llama_cpp_permute(rows: &[f32], hd: usize, row_len: usize) -> Vec<f32> {
        let mut out = vec![0.0; rows.len()];
        for (h, head) in rows.chunks(hd * row_len).enumerate() {
            for j in 0..hd / 2 {
                for t in 0..2 {
                    let (src, dst) = (t * hd / 2 + j, 2 * j + t);
                    let o = h * hd * row_len;
                    out[o + dst * row_len..o + (dst + 1) * row_len]
                        .copy_from_slice(&head[src * row_len..(src + 1) * row_len]);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::llama_header;
    use super::*;
    use crate::gguf::testfile::GgufBuilder;
    use crate::gguf::Value;
    use crate::gpu::cuda::init::init_tensor_f32;

    /// The `tiny` shape's seeded weights written as a tied-embedding llama GGUF (F32).
    fn tiny_gguf(drop: Option<&str>, skew: Option<&str>) -> (ModelShape, Vec<u8>) {
        let mut shape = ModelShape::named("tiny").unwrap();
        shape.tied_embeddings = true;
        let mut b = llama_header(&shape);
        for t in crate::gpu::cuda::model_files::model_tensors(&shape) {
            let name = gguf_name(t);
            if drop == Some(name.as_str()) {
                continue;
            }
            let (r, c) = t.dims(&shape);
            let mut dims = if r == 1 {
                vec![c as u64]
            } else {
                vec![c as u64, r as u64]
            };
            if skew == Some(name.as_str()) {
                dims.reverse();
            }
            b = b.f32_tensor(&name, &dims, &init_tensor_f32(&shape, 5, t));
        }
        (shape, b.build())
    }

    #[test]
    fn a_llama_gguf_loads_its_shape_and_the_same_logits_as_the_source_weights() {
        let (shape, bytes) = tiny_gguf(None, None);
        let g = Gguf::parse(bytes, "tiny.gguf").unwrap();
        let got = shape_from_gguf(&g).unwrap();
        assert_eq!(
            got,
            ModelShape {
                name: "gguf".into(),
                ..shape.clone()
            }
        );
        let m = load_cpu_model(&g).unwrap();
        assert_eq!(m.rope, RopeLayout::Interleaved);
        let want = CpuModel::from_fn(&shape, |t| init_tensor_f32(&shape, 5, t))
            .with_rope(RopeLayout::Interleaved);
        let p = [4u32, 8, 15, 16, 23, 42];
        assert_eq!(
            m.forward(&mut m.new_cache(), &p),
            want.forward(&mut want.new_cache(), &p)
        );
    }

    #[test]
    fn missing_or_transposed_tensors_are_errors_naming_them() {
        let load = |drop, skew| {
            let g = Gguf::parse(tiny_gguf(drop, skew).1, "tiny.gguf").unwrap();
            load_cpu_model(&g).err().map(|e| e.to_string())
        };
        let e = load(Some("blk.1.ffn_up.weight"), None).unwrap_or_default();
        assert!(
            e.contains("blk.1.ffn_up.weight") && e.contains("not in the file"),
            "{e}"
        );
        let e = load(None, Some("blk.0.attn_k.weight")).unwrap_or_default();
        assert!(
            e.contains("blk.0.attn_k.weight") && e.contains("[128, 256]"),
            "{e}"
        );
    }

    #[test]
    fn rope_scaling_comes_from_the_metadata_or_rope_freqs_and_yarn_is_refused() {
        let base = |extra: GgufBuilder| {
            let u = |v: usize| Value::U32(v as u32);
            extra
                .kv("general.architecture", Value::String("llama".into()))
                .kv("llama.embedding_length", u(256))
                .kv("llama.block_count", u(1))
                .kv("llama.feed_forward_length", u(512))
                .kv("llama.attention.head_count", u(8))
                .kv("llama.attention.head_count_kv", u(2))
                .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
                .f32_tensor("token_embd.weight", &[256, 4], &[0.0; 1024])
        };
        let shape = |b: GgufBuilder| shape_from_gguf(&Gguf::parse(b.build(), "r.gguf").unwrap());
        let linear = GgufBuilder::default()
            .kv("llama.rope.dimension_count", Value::U32(32))
            .kv("llama.rope.scaling.type", Value::String("linear".into()))
            .kv("llama.rope.scaling.factor", Value::F32(4.0));
        assert_eq!(
            shape(base(linear)).unwrap().rope_scaling,
            RopeScaling::Linear { factor: 4.0 }
        );
        let factors: Vec<f32> = (0..16).map(|i| 1.0 + i as f32).collect();
        let freqs = GgufBuilder::default().f32_tensor("rope_freqs.weight", &[16], &factors);
        assert_eq!(
            shape(base(freqs)).unwrap().rope_scaling,
            RopeScaling::Factors(factors)
        );
        let yarn =
            GgufBuilder::default().kv("llama.rope.scaling.type", Value::String("yarn".into()));
        let e = shape(base(yarn)).unwrap_err().to_string();
        assert!(e.contains("yarn") && e.contains("not supported"), "{e}");
        // RoPE over part of the head is refused.
        let partial = GgufBuilder::default().kv("llama.rope.dimension_count", Value::U32(16));
        let e = shape(base(partial)).unwrap_err().to_string();
        assert!(e.contains("RoPE over"), "{e}");
    }

    #[test]
    fn other_architectures_are_refused() {
        let g = Gguf::parse(
            GgufBuilder::default()
                .kv("general.architecture", Value::String("qwen2".into()))
                .build(),
            "q.gguf",
        )
        .unwrap();
        let e = shape_from_gguf(&g).unwrap_err().to_string();
        assert!(e.contains("q.gguf") && e.contains("qwen2"), "{e}");
    }
}

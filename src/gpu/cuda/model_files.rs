//! A real checkpoint on disk as the backend loads it: a Hugging Face directory in the Llama
//! layout (`config.json` + `*.safetensors`, BF16/F16/F32) or a Llama-architecture GGUF file
//! (the quantisations `gguf::dequantize` knows, dequantised at load). Every tensor comes out
//! in the HF layout ([out, in] row-major); GGUF's Q and K rows, which llama.cpp's converter
//! permuted for interleaved RoPE, are put back in HF's rotate-half order, so the kernels and
//! the CPU reference run one RoPE layout. Errors name the file and the tensor. Host-only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::cpu_ref::{CpuLoadError, CpuModel};
use super::gguf_llama::{gguf_name, shape_from_gguf};
use super::init::{f32_to_bf16_bits, Tensor};
use super::safetensors::{Checkpoint, DType};
use super::shape::ModelShape;
use crate::gguf::{gguf_file, Gguf};

/// Why a checkpoint cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {msg}")]
    Bad { path: String, msg: String },
    #[error("{path}: tensor {name}: {msg}")]
    Tensor {
        path: String,
        name: String,
        msg: String,
    },
}

/// Which kind of checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    Gguf,
}

enum Source {
    Hf(Checkpoint),
    Gguf(Gguf),
}

/// An opened checkpoint: its shape and its tensors.
pub struct ModelFiles {
    /// The directory (HF) or the file (GGUF).
    pub path: PathBuf,
    pub shape: ModelShape,
    source: Source,
}

impl ModelFiles {
    /// Opens `path`: a `.gguf` file (or a directory holding exactly one), or a HF directory.
    /// Checks the shape against the kernels' limits and every tensor's presence, dims and
    /// type, and refuses tensors the Llama layout does not use (biases, for example).
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let p = path.display().to_string();
        let bad = |msg: String| LoadError::Bad {
            path: p.clone(),
            msg,
        };
        let files = if let Some(file) = gguf_file(path) {
            let g = Gguf::open(&file).map_err(|e| bad(e.to_string()))?;
            let shape = shape_from_gguf(&g).map_err(|e| bad(e.to_string()))?;
            ModelFiles {
                path: file,
                shape,
                source: Source::Gguf(g),
            }
        } else if path.join("config.json").is_file() {
            let shape = ModelShape::from_hf_config(&path.join("config.json"))
                .map_err(|e| bad(e.to_string()))?;
            let ck = Checkpoint::open(path).map_err(|e| bad(e.to_string()))?;
            ModelFiles {
                path: path.to_path_buf(),
                shape,
                source: Source::Hf(ck),
            }
        } else {
            return Err(bad(
                "neither a .gguf file nor a directory with config.json and *.safetensors".into(),
            ));
        };
        files
            .shape
            .validate()
            .map_err(|e| bad(format!("the CUDA kernels cannot run it: {e}")))?;
        files.check()?;
        Ok(files)
    }

    pub fn format(&self) -> Format {
        match self.source {
            Source::Hf(_) => Format::Safetensors,
            Source::Gguf(_) => Format::Gguf,
        }
    }

    /// The parsed GGUF file (tokenizer metadata), when this is one.
    pub fn gguf(&self) -> Option<&Gguf> {
        match &self.source {
            Source::Gguf(g) => Some(g),
            Source::Hf(_) => None,
        }
    }

    /// Every tensor the shape needs, in load order.
    pub fn tensors(&self) -> Vec<Tensor> {
        model_tensors(&self.shape)
    }

    /// The name of `t` in this file.
    pub fn name(&self, t: Tensor) -> String {
        match self.source {
            Source::Hf(_) => t.hf_name(),
            Source::Gguf(_) => gguf_name(t),
        }
    }

    fn tensor_err(&self, name: &str, msg: String) -> LoadError {
        LoadError::Tensor {
            path: self.path.display().to_string(),
            name: name.to_string(),
            msg,
        }
    }

    /// Presence, dims and type of every needed tensor, and no tensor left unused.
    fn check(&self) -> Result<(), LoadError> {
        let needed = self.tensors();
        let mut used = BTreeSet::new();
        for &t in &needed {
            let name = self.name(t);
            let (rows, cols) = t.dims(&self.shape);
            match &self.source {
                Source::Hf(ck) => {
                    let info = ck
                        .info(&name)
                        .ok_or_else(|| self.tensor_err(&name, "missing".into()))?;
                    let want = if rows == 1 {
                        vec![cols]
                    } else {
                        vec![rows, cols]
                    };
                    if info.shape != want {
                        return Err(self.tensor_err(
                            &name,
                            format!("shape {:?}, the config implies {want:?}", info.shape),
                        ));
                    }
                }
                Source::Gguf(g) => {
                    let info = g
                        .tensor(&name)
                        .ok_or_else(|| self.tensor_err(&name, "missing".into()))?;
                    // GGUF lists dims fastest first.
                    let want: Vec<u64> = if rows == 1 {
                        vec![cols as u64]
                    } else {
                        vec![cols as u64, rows as u64]
                    };
                    if info.dims != want {
                        return Err(self.tensor_err(
                            &name,
                            format!("dims {:?}, the metadata implies {want:?}", info.dims),
                        ));
                    }
                    if !crate::gguf::quant::dequantizes(info.ty) {
                        return Err(self.tensor_err(
                            &name,
                            format!(
                                "type {:?} is not supported (supported: {})",
                                info.ty,
                                crate::gguf::quant::SUPPORTED
                            ),
                        ));
                    }
                }
            }
            used.insert(name);
        }
        let all: Vec<String> = match &self.source {
            Source::Hf(ck) => ck.names().map(str::to_string).collect(),
            Source::Gguf(g) => g.tensors().iter().map(|t| t.name.clone()).collect(),
        };
        let ignorable = |n: &str| {
            n.ends_with("rotary_emb.inv_freq")
                || n == "rope_freqs.weight" // read into the shape's RoPE scaling
                || (self.shape.tied_embeddings && (n == "lm_head.weight" || n == "output.weight"))
        };
        if let Some(extra) = all.iter().find(|n| !used.contains(*n) && !ignorable(n)) {
            let why = if extra.ends_with(".bias") {
                "biases are not supported (Llama layout only)"
            } else {
                "not part of the Llama layout this backend runs"
            };
            return Err(self.tensor_err(extra, why.into()));
        }
        Ok(())
    }

    /// Tensor `t` as f32 in the HF layout.
    pub fn tensor_f32(&self, t: Tensor) -> Result<Vec<f32>, LoadError> {
        let name = self.name(t);
        let v = match &self.source {
            Source::Hf(ck) => ck
                .f32(&name)
                .map_err(|e| self.tensor_err(&name, e.to_string()))?,
            Source::Gguf(g) => {
                let v = g
                    .tensor_f32(&name)
                    .map_err(|e| self.tensor_err(&name, e.to_string()))?;
                let s = &self.shape;
                match t {
                    Tensor::Q(_) | Tensor::K(_) => unpermute_rows(&v, s.head_dim, s.hidden),
                    _ => v,
                }
            }
        };
        let (r, c) = t.dims(&self.shape);
        if v.len() != r * c {
            return Err(self.tensor_err(
                &name,
                format!("{} values, the shape needs {}", v.len(), r * c),
            ));
        }
        Ok(v)
    }

    /// Tensor `t` as bf16 bits in the HF layout (BF16 safetensors are copied as they are;
    /// everything else is rounded to nearest even).
    pub fn tensor_bf16(&self, t: Tensor) -> Result<Vec<u16>, LoadError> {
        if let Source::Hf(ck) = &self.source {
            let name = self.name(t);
            if ck.info(&name).is_some_and(|i| i.dtype == DType::BF16) {
                return ck
                    .bf16_bits(&name)
                    .map_err(|e| self.tensor_err(&name, e.to_string()));
            }
        }
        Ok(self
            .tensor_f32(t)?
            .into_iter()
            .map(f32_to_bf16_bits)
            .collect())
    }

    /// The f32 CPU reference of these weights. `round_bf16`: each weight rounded through
    /// bf16 first, the values the device holds.
    pub fn cpu_model(&self, round_bf16: bool) -> Result<CpuModel, LoadError> {
        CpuModel::try_from_fn(&self.shape, |t| {
            self.tensor_f32(t).map(|v| {
                if round_bf16 {
                    v.into_iter().map(super::init::round_bf16).collect()
                } else {
                    v
                }
            })
        })
        .map_err(|e| match e {
            CpuLoadError::Source { source, .. } => match source.downcast::<LoadError>() {
                Ok(le) => *le,
                Err(other) => LoadError::Bad {
                    path: self.path.display().to_string(),
                    msg: other.to_string(),
                },
            },
            other => LoadError::Bad {
                path: self.path.display().to_string(),
                msg: other.to_string(),
            },
        })
    }
}

/// Every tensor a model of shape `s` needs, in load order (no LM head when tied).
pub fn model_tensors(s: &ModelShape) -> Vec<Tensor> {
    let mut v = vec![Tensor::Embed];
    for i in 0..s.layers {
        v.extend([
            Tensor::AttnNorm(i),
            Tensor::Q(i),
            Tensor::K(i),
            Tensor::V(i),
            Tensor::O(i),
            Tensor::FfnNorm(i),
            Tensor::Gate(i),
            Tensor::Up(i),
            Tensor::Down(i),
        ]);
        if s.is_recurrent(i) {
            v.extend([Tensor::Decay(i), Tensor::DecayBias(i)]);
        }
    }
    v.push(Tensor::FinalNorm);
    if !s.tied_embeddings {
        v.push(Tensor::LmHead);
    }
    v
}

/// Writes the seeded weights of `shape` (`init::init_tensor_f32(shape, seed, ..)`, rounded to
/// bf16) as a Hugging Face checkpoint in `dir`: `config.json` and `model.safetensors`. For
/// tests and tools that need a checkpoint of a shape no named model has.
pub fn write_hf_checkpoint(dir: &Path, shape: &ModelShape, seed: u32) -> std::io::Result<()> {
    write_hf_checkpoint_with(dir, shape, |t| {
        Ok(super::init::init_tensor_f32(shape, seed, t)
            .into_iter()
            .map(f32_to_bf16_bits)
            .collect())
    })
}

/// Writes `shape` with tensors from `bits` (bf16, HF layout) as a Hugging Face checkpoint in
/// `dir`, e.g. a GGUF file's weights for PyTorch to load (`genslot-gpu export-hf`).
pub fn write_hf_checkpoint_with(
    dir: &Path,
    shape: &ModelShape,
    mut bits: impl FnMut(Tensor) -> std::io::Result<Vec<u16>>,
) -> std::io::Result<()> {
    use super::shape::RopeScaling;
    let mut cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape.hidden, "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "vocab_size": shape.vocab, "rms_norm_eps": shape.rms_eps,
        "tie_word_embeddings": shape.tied_embeddings, "rope_theta": shape.rope_theta,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "attention_bias": false,
        "mlp_bias": false, "max_position_embeddings": 8192,
    });
    let scaling = match &shape.rope_scaling {
        RopeScaling::None => serde_json::Value::Null,
        RopeScaling::Linear { factor } => {
            serde_json::json!({"rope_type": "linear", "factor": factor})
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => serde_json::json!({"rope_type": "llama3", "factor": factor,
            "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position}),
        RopeScaling::Factors(_) => {
            return Err(std::io::Error::other(
                "per-frequency RoPE factors have no Hugging Face config form",
            ))
        }
    };
    cfg["rope_scaling"] = scaling;
    if shape.recurrent_layers() > 0 {
        // Not a Llama any more: a name transformers does not know makes it refuse the
        // checkpoint instead of loading it as attention layers with unused decay weights.
        cfg["architectures"] = serde_json::json!(["GenslotHybridForCausalLM"]);
        cfg["model_type"] = "genslot_hybrid".into();
        cfg["layer_types"] = serde_json::json!(shape.mix.layer_types(shape.layers));
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u16>)> = Vec::new();
    for t in model_tensors(shape) {
        let (r, c) = t.dims(shape);
        let dims = if r == 1 { vec![c] } else { vec![r, c] };
        tensors.push((t.hf_name(), dims, bits(t)?));
    }
    super::safetensors::write_bf16(&dir.join("model.safetensors"), &tensors)
}

/// Undoes llama.cpp's Q/K permutation of each head's rows: GGUF row 2j + t of a head holds
/// HF row t·D/2 + j (`rows` is [heads · hd, row_len] row-major).
pub fn unpermute_rows(rows: &[f32], hd: usize, row_len: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows.len()];
    let head = hd * row_len;
    for (h, src) in rows.chunks(head).enumerate() {
        let dst = &mut out[h * head..h * head + src.len()];
        for j in 0..hd / 2 {
            for t in 0..2 {
                let (from, to) = (2 * j + t, t * hd / 2 + j);
                if (from + 1) * row_len <= src.len() {
                    dst[to * row_len..(to + 1) * row_len]
                        .copy_from_slice(&src[from * row_len..(from + 1) * row_len]);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::quant::GgmlType;
    use crate::gpu::cuda::cpu_ref::RopeLayout;
    use crate::gpu::cuda::gguf_llama::test_support::{llama_cpp_permute, llama_header};
    use crate::gpu::cuda::init::init_tensor_f32;
    use crate::gpu::cuda::safetensors::write_bf16;

    /// `tiny` with tied embeddings and `kv_heads` (3 query heads per kv head by default).
    fn shape(kv_heads: usize) -> ModelShape {
        ModelShape {
            heads: 6,
            kv_heads,
            tied_embeddings: true,
            ..ModelShape::named("tiny").unwrap()
        }
    }

    /// The shape's seeded weights as a llama GGUF (F32, Q/K permuted as llama.cpp writes
    /// them); `edit` may change one tensor's entry.
    fn gguf_bytes(s: &ModelShape, edit: impl Fn(&str) -> Option<(Vec<u64>, GgmlType)>) -> Vec<u8> {
        let mut b = llama_header(s);
        for t in model_tensors(s) {
            let name = gguf_name(t);
            let (r, c) = t.dims(s);
            let mut w = init_tensor_f32(s, 9, t);
            if matches!(t, Tensor::Q(_) | Tensor::K(_)) {
                w = llama_cpp_permute(&w, s.head_dim, s.hidden);
            }
            let dims = if r == 1 {
                vec![c as u64]
            } else {
                vec![c as u64, r as u64]
            };
            match edit(&name) {
                None => b = b.f32_tensor(&name, &dims, &w),
                Some((d, GgmlType::F32)) => b = b.f32_tensor(&name, &d, &w),
                Some((d, ty)) => b = b.tensor(&name, &d, ty, quantised(ty, &d).0),
            }
        }
        b.build()
    }

    /// A `ty` tensor of `dims`: the golden blocks of `ty` repeated (zeros for a type the
    /// golden file lacks), and their values.
    fn quantised(ty: GgmlType, dims: &[u64]) -> (Vec<u8>, Vec<f32>) {
        let (per, size) = ty.block().unwrap();
        let n = dims.iter().product::<u64>();
        let golden = crate::gguf::quant::golden();
        let Some((_, bytes, vals)) = golden.iter().find(|g| g.0 == ty) else {
            return (vec![0; (n / per * size) as usize], Vec::new());
        };
        let bytes = bytes.iter().cycle().take((n / per * size) as usize);
        let vals = vals.iter().cycle().take(n as usize);
        (bytes.copied().collect(), vals.copied().collect())
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        let x: Vec<f32> = (0..3 * 64 * 5).map(|i| i as f32).collect();
        assert_eq!(unpermute_rows(&llama_cpp_permute(&x, 64, 5), 64, 5), x);
        assert_ne!(llama_cpp_permute(&x, 64, 5), x);
    }

    #[test]
    fn a_gguf_with_three_query_heads_per_kv_head_loads_in_hf_layout() {
        let s = shape(2);
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "m.gguf", &gguf_bytes(&s, |_| None));
        // A directory holding one .gguf opens it too.
        for path in [p.clone(), dir.path().to_path_buf()] {
            let f = ModelFiles::open(&path).unwrap();
            assert_eq!(f.format(), Format::Gguf);
            assert_eq!((f.shape.group(), f.shape.tied_embeddings), (3, true));
            assert_eq!(f.path, p);
        }
        let f = ModelFiles::open(&p).unwrap();
        // Un-permuted Q/K with rotate-half RoPE = the permuted file with interleaved RoPE =
        // the source weights with rotate-half.
        let hf = f.cpu_model(false).unwrap();
        let raw = crate::gpu::cuda::gguf_llama::load_cpu_model(f.gguf().unwrap()).unwrap();
        assert_eq!(raw.rope, RopeLayout::Interleaved);
        let src = CpuModel::from_fn(&s, |t| init_tensor_f32(&s, 9, t));
        let prompt = [3u32, 99, 512, 7, 1000, 42];
        let a = hf.forward(&mut hf.new_cache(), &prompt);
        let b = raw.forward(&mut raw.new_cache(), &prompt);
        let c = src.forward(&mut src.new_cache(), &prompt);
        for ((a, b), c) in a.iter().zip(&b).zip(&c) {
            assert_eq!(a, c);
            let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(err < 1e-4, "{err}");
        }
        let bits = f.tensor_bf16(Tensor::Q(1)).unwrap();
        let want: Vec<u16> = init_tensor_f32(&s, 9, Tensor::Q(1))
            .into_iter()
            .map(f32_to_bf16_bits)
            .collect();
        assert_eq!(bits, want);
    }

    #[test]
    fn k_quant_and_legacy_quant_tensors_load_as_llama_cpp_dequantises_them() {
        // Q4_K_M files mix Q4_K and Q6_K; older ones are Q4_0 / Q5_x. Each type's tensor reads
        // back as the golden values (dequantised by llama.cpp's package) rounded to bf16;
        // attn_q also goes through the un-permutation.
        let s = shape(2);
        let dir = tempfile::tempdir().unwrap();
        let picks = [
            ("blk.0.ffn_up.weight", Tensor::Up(0), GgmlType::Q6K),
            ("blk.0.ffn_gate.weight", Tensor::Gate(0), GgmlType::Q4K),
            ("blk.1.ffn_up.weight", Tensor::Up(1), GgmlType::Q5K),
            ("blk.1.ffn_gate.weight", Tensor::Gate(1), GgmlType::Q3K),
            ("blk.0.ffn_down.weight", Tensor::Down(0), GgmlType::Q2K),
            ("blk.1.ffn_down.weight", Tensor::Down(1), GgmlType::Q5_0),
            ("blk.0.attn_v.weight", Tensor::V(0), GgmlType::Q5_1),
            ("blk.1.attn_v.weight", Tensor::V(1), GgmlType::Q4_0),
            ("blk.1.attn_q.weight", Tensor::Q(1), GgmlType::Q4K),
        ];
        let dims = |t: Tensor| {
            let (r, c) = t.dims(&s);
            vec![c as u64, r as u64]
        };
        let edit = |n: &str| {
            let &(_, t, ty) = picks.iter().find(|p| p.0 == n)?;
            Some((dims(t), ty))
        };
        let p = write(dir.path(), "k.gguf", &gguf_bytes(&s, edit));
        let f = ModelFiles::open(&p).unwrap();
        for (name, t, ty) in picks {
            let mut want = quantised(ty, &dims(t)).1;
            assert!(!want.is_empty(), "{ty:?} has golden blocks");
            if matches!(t, Tensor::Q(_)) {
                want = unpermute_rows(&want, s.head_dim, s.hidden);
            }
            let want: Vec<u16> = want.into_iter().map(f32_to_bf16_bits).collect();
            assert_eq!(f.tensor_bf16(t).unwrap(), want, "{name} as {ty:?}");
        }
        // The CPU reference reads them too and computes finite logits.
        let m = f.cpu_model(false).unwrap();
        let logits = m.forward(&mut m.new_cache(), &[1, 2, 3]);
        assert!(logits.iter().flatten().all(|v| v.is_finite()));
    }

    #[test]
    fn unsupported_types_dims_and_missing_tensors_are_errors_naming_the_tensor() {
        let s = shape(2);
        let dir = tempfile::tempdir().unwrap();
        type Edit<'a> = &'a dyn Fn(&str) -> Option<(Vec<u64>, GgmlType)>;
        let err = |edit: Edit| {
            let p = write(dir.path(), "e.gguf", &gguf_bytes(&s, edit));
            ModelFiles::open(&p)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = err(&|n| (n == "blk.1.ffn_up.weight").then(|| (vec![256, 512], GgmlType::Q8K)));
        assert!(
            e.contains("blk.1.ffn_up.weight") && e.contains("Q8K") && e.contains("not supported"),
            "{e}"
        );
        let e = err(&|n| (n == "blk.0.attn_v.weight").then(|| (vec![128, 256], GgmlType::F32)));
        assert!(
            e.contains("blk.0.attn_v.weight") && e.contains("dims [128, 256]"),
            "{e}"
        );
        // A 17th query head per kv head is past the kernels.
        let wide = ModelShape {
            heads: 17,
            kv_heads: 1,
            ..shape(1)
        };
        let p = write(dir.path(), "w.gguf", &gguf_bytes(&wide, |_| None));
        let e = ModelFiles::open(&p)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("17 query heads per kv head"), "{e}");
    }

    /// The shape's seeded weights as a HF checkpoint, plus `extra` tensors.
    fn hf_dir(s: &ModelShape, dir: &Path, extra: &[(&str, Vec<usize>)], drop: Option<&str>) {
        let cfg = serde_json::json!({
            "hidden_size": s.hidden, "intermediate_size": s.ffn,
            "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
            "vocab_size": s.vocab, "rms_norm_eps": s.rms_eps,
            "tie_word_embeddings": s.tied_embeddings, "rope_theta": s.rope_theta,
        });
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u16>)> = model_tensors(s)
            .into_iter()
            .filter(|t| Some(t.hf_name().as_str()) != drop)
            .map(|t| {
                let (r, c) = t.dims(s);
                let shape = if r == 1 { vec![c] } else { vec![r, c] };
                let bits = init_tensor_f32(s, 4, t).into_iter().map(f32_to_bf16_bits);
                (t.hf_name(), shape, bits.collect())
            })
            .collect();
        for (name, shape) in extra {
            let n = shape.iter().product();
            tensors.push((name.to_string(), shape.clone(), vec![0; n]));
        }
        write_bf16(&dir.join("model.safetensors"), &tensors).unwrap();
    }

    #[test]
    fn a_written_checkpoint_reopens_with_its_shape_and_the_seeded_weights() {
        let s = ModelShape {
            rope_scaling: crate::gpu::cuda::shape::RopeScaling::llama3(8.0),
            ..shape(2)
        };
        let dir = tempfile::tempdir().unwrap();
        write_hf_checkpoint(dir.path(), &s, 12).unwrap();
        let f = ModelFiles::open(dir.path()).unwrap();
        let want_name = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        assert_eq!(
            f.shape,
            ModelShape {
                name: want_name,
                ..s.clone()
            }
        );
        let cpu = f.cpu_model(false).unwrap();
        let seeded = CpuModel::from_fn(&s, |t| {
            init_tensor_f32(&s, 12, t)
                .into_iter()
                .map(crate::gpu::cuda::init::round_bf16)
                .collect()
        });
        let p = [1u32, 2, 3];
        assert_eq!(
            cpu.forward(&mut cpu.new_cache(), &p),
            seeded.forward(&mut seeded.new_cache(), &p)
        );
    }

    #[test]
    fn a_hybrid_checkpoint_reopens_as_the_hybrid_with_its_decay_weights() {
        let s = ModelShape::named("tiny-hybrid").unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_hf_checkpoint(dir.path(), &s, 5).unwrap();
        let f = ModelFiles::open(dir.path()).unwrap();
        assert_eq!(f.shape.mix, s.mix);
        assert_eq!(f.shape.recurrent_layers(), 2);
        let want: Vec<u16> = init_tensor_f32(&s, 5, Tensor::DecayBias(2))
            .into_iter()
            .map(f32_to_bf16_bits)
            .collect();
        assert_eq!(f.tensor_bf16(Tensor::DecayBias(2)).unwrap(), want);
        let cpu = f.cpu_model(false).unwrap();
        let seeded = CpuModel::seeded(&s, 5);
        let p = [4u32, 800, 15, 15, 2];
        let (mut c1, mut c2) = (cpu.new_cache(), seeded.new_cache());
        assert_eq!(cpu.forward(&mut c1, &p), seeded.forward(&mut c2, &p));
        assert_eq!(c1.states().count(), 2);
        // Without layer_types the decay tensors are not part of the (attention-only) layout.
        let cfg = dir.path().join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("layer_types");
        std::fs::write(&cfg, v.to_string()).unwrap();
        let e = ModelFiles::open(dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("linear_attn.decay_proj"), "{e}");
    }

    #[test]
    fn a_hf_checkpoint_loads_and_refuses_biases_and_missing_tensors_by_name() {
        let s = shape(2);
        let dir = tempfile::tempdir().unwrap();
        hf_dir(&s, dir.path(), &[], None);
        let f = ModelFiles::open(dir.path()).unwrap();
        assert_eq!((f.format(), f.shape.group()), (Format::Safetensors, 3));
        let want: Vec<u16> = init_tensor_f32(&s, 4, Tensor::K(0))
            .into_iter()
            .map(f32_to_bf16_bits)
            .collect();
        assert_eq!(f.tensor_bf16(Tensor::K(0)).unwrap(), want);
        let bias = "model.layers.0.self_attn.q_proj.bias";
        hf_dir(&s, dir.path(), &[(bias, vec![384])], None);
        let e = ModelFiles::open(dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains(bias) && e.contains("biases are not supported"),
            "{e}"
        );
        let gone = "model.layers.1.mlp.down_proj.weight";
        hf_dir(&s, dir.path(), &[], Some(gone));
        let e = ModelFiles::open(dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(gone) && e.contains("missing"), "{e}");
        let nothing = tempfile::tempdir().unwrap();
        let e = ModelFiles::open(nothing.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("neither a .gguf file"), "{e}");
    }
}

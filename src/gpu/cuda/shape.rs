//! Llama-family model shapes: the named ones (`tiny`, `llama-1b`, `llama-8b`) and the shape
//! read from a Hugging Face `config.json`.

use std::path::Path;

use serde_json::Value;

/// Dimensions of a Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    pub name: String,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// The LM head shares the embedding matrix.
    pub tied_embeddings: bool,
}

/// A shape the CUDA kernels cannot run, or a `config.json` that does not describe one.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("unknown model shape {0:?} (known: tiny, llama-1b, llama-8b)")]
    UnknownName(String),
    #[error("{path}: {msg}")]
    Config { path: String, msg: String },
    #[error("shape {name}: {msg}")]
    Unsupported { name: String, msg: String },
}

impl ModelShape {
    /// A named shape. `llama-1b` has Llama-3.2-1B's dimensions and `llama-8b` Llama-3.1-8B's
    /// (plain RoPE: the llama3 frequency scaling only matters past 8k positions and is not
    /// modelled).
    pub fn named(name: &str) -> Result<Self, ShapeError> {
        let s = match name {
            "tiny" => ModelShape {
                name: "tiny".into(),
                vocab: 1024,
                hidden: 256,
                layers: 2,
                heads: 8,
                kv_heads: 2,
                head_dim: 64,
                ffn: 512,
                rope_theta: 10000.0,
                rms_eps: 1e-5,
                tied_embeddings: false,
            },
            "llama-1b" => ModelShape {
                name: "llama-1b".into(),
                vocab: 128_256,
                hidden: 2048,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                head_dim: 64,
                ffn: 8192,
                rope_theta: 500_000.0,
                rms_eps: 1e-5,
                tied_embeddings: true,
            },
            "llama-8b" => ModelShape {
                name: "llama-8b".into(),
                vocab: 128_256,
                hidden: 4096,
                layers: 32,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                ffn: 14_336,
                rope_theta: 500_000.0,
                rms_eps: 1e-5,
                tied_embeddings: false,
            },
            other => return Err(ShapeError::UnknownName(other.to_string())),
        };
        Ok(s)
    }

    /// Reads a Hugging Face Llama `config.json` (transformers 4 or 5 layout).
    pub fn from_hf_config(path: &Path) -> Result<Self, ShapeError> {
        let p = path.display().to_string();
        let err = |msg: String| ShapeError::Config {
            path: p.clone(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| err(format!("line {} column {}: {e}", e.line(), e.column())))?;
        let int = |k: &str| -> Result<usize, ShapeError> {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| err(format!("missing or non-integer field {k:?}")))
        };
        let hidden = int("hidden_size")?;
        let heads = int("num_attention_heads")?;
        let kv_heads = match v.get("num_key_value_heads") {
            Some(Value::Null) | None => heads,
            Some(_) => int("num_key_value_heads")?,
        };
        let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None if heads > 0 => hidden / heads,
            None => return Err(err("num_attention_heads is 0".into())),
        };
        // transformers 5 moved rope_theta into rope_parameters.
        let theta = v
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| {
                v.get("rope_parameters")
                    .and_then(|r| r.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0);
        let rope_type = v
            .get("rope_parameters")
            .or_else(|| v.get("rope_scaling"))
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            return Err(err(format!(
                "rope type {rope_type:?} is not supported (only default)"
            )));
        }
        let shape = ModelShape {
            name: path
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "checkpoint".into()),
            vocab: int("vocab_size")?,
            hidden,
            layers: int("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            ffn: int("intermediate_size")?,
            rope_theta: theta as f32,
            rms_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-5) as f32,
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Checks the limits of the kernels: head_dim 64 or 128, 1..=8 query heads per kv head,
    /// rows that split into 16-byte vectors.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let bad = |msg: String| ShapeError::Unsupported {
            name: self.name.clone(),
            msg,
        };
        if self.head_dim != 64 && self.head_dim != 128 {
            return Err(bad(format!(
                "head_dim {} (supported: 64, 128)",
                self.head_dim
            )));
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(bad(format!(
                "{} heads over {} kv heads",
                self.heads, self.kv_heads
            )));
        }
        let g = self.heads / self.kv_heads;
        if !matches!(g, 1 | 2 | 4 | 8) {
            return Err(bad(format!(
                "{g} query heads per kv head (supported: 1, 2, 4, 8)"
            )));
        }
        if !self.hidden.is_multiple_of(8)
            || !self.ffn.is_multiple_of(8)
            || self.layers == 0
            || self.vocab == 0
        {
            return Err(bad(
                "hidden and ffn must be multiples of 8; layers, vocab > 0".into(),
            ));
        }
        Ok(())
    }

    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Width of the fused q|k|v projection.
    pub fn qkv_dim(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Parameters, counting a tied LM head once.
    pub fn param_count(&self) -> u64 {
        let (h, f, v) = (self.hidden as u64, self.ffn as u64, self.vocab as u64);
        let attn = h * self.qkv_dim() as u64 + (self.heads * self.head_dim) as u64 * h;
        let per_layer = attn + 3 * h * f + 2 * h;
        let head = if self.tied_embeddings { 0 } else { v * h };
        v * h + self.layers as u64 * per_layer + h + head
    }

    /// bf16 KV bytes one token occupies across all layers.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * self.layers * self.kv_heads * self.head_dim * 2) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_8b_and_1b_shapes_have_the_published_parameter_counts() {
        // Llama-3.1-8B: 8,030,261,248 parameters; Llama-3.2-1B (tied): 1,235,814,400.
        assert_eq!(
            ModelShape::named("llama-8b").unwrap().param_count(),
            8_030_261_248
        );
        assert_eq!(
            ModelShape::named("llama-1b").unwrap().param_count(),
            1_235_814_400
        );
    }

    #[test]
    fn every_named_shape_passes_the_kernel_limits() {
        for n in ["tiny", "llama-1b", "llama-8b"] {
            ModelShape::named(n).unwrap().validate().unwrap();
        }
        assert!(matches!(
            ModelShape::named("gpt-5"),
            Err(ShapeError::UnknownName(_))
        ));
    }

    #[test]
    fn hf_config_reads_transformers_5_rope_parameters_and_names_the_missing_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,
               "num_attention_heads":8,"num_key_value_heads":2,"head_dim":64,"vocab_size":1024,
               "rms_norm_eps":1e-6,"tie_word_embeddings":true,
               "rope_parameters":{"rope_theta":500000.0,"rope_type":"default"}}"#,
        )
        .unwrap();
        let s = ModelShape::from_hf_config(&p).unwrap();
        assert_eq!((s.head_dim, s.group(), s.rope_theta), (64, 4, 500000.0));
        assert!(s.tied_embeddings);
        std::fs::write(&p, r#"{"hidden_size":256}"#).unwrap();
        let e = ModelShape::from_hf_config(&p).unwrap_err().to_string();
        assert!(
            e.contains("num_attention_heads") && e.contains("config.json"),
            "{e}"
        );
    }

    #[test]
    fn unsupported_head_dim_is_an_error_not_a_panic() {
        let mut s = ModelShape::named("tiny").unwrap();
        s.head_dim = 96;
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("head_dim 96"));
    }
}

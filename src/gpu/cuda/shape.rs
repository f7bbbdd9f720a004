//! Llama-family model shapes: the named ones (`tiny`, `llama-1b`, `llama-8b`, and the hybrid
//! `tiny-hybrid` and `llama-hybrid-1b`) and the shape read from a Hugging Face `config.json`.

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
    /// How the rotary frequencies derived from `rope_theta` are rescaled for long contexts.
    pub rope_scaling: RopeScaling,
    pub rms_eps: f32,
    /// The LM head shares the embedding matrix.
    pub tied_embeddings: bool,
    /// Which layers are softmax attention and which a gated linear-attention recurrence.
    pub mix: LayerMix,
}

/// The kind of each layer's token mixer.
///
/// A recurrent layer replaces attention by a gated linear attention with a fixed-size state
/// per kv head (f32, head_dim x head_dim), on the same fused q|k|v projection and o_proj:
/// q and k are L2-normalised per head (no RoPE), the decay is
/// `a = exp(-softplus(w_a · h + b_a))` per kv head from the layer's normed input `h`, and
/// `S = a·S + k vᵀ`, `o = Sᵀ q` for each query head of the kv head's group. Prefill and decode
/// run the same recurrence; the state is what a request keeps instead of KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerMix {
    /// Softmax attention in every layer.
    #[default]
    Attention,
    /// Recurrent layers, with softmax attention in the last layer of every group of
    /// `attention_every` (layer l attends when (l + 1) % attention_every == 0).
    Hybrid { attention_every: usize },
}

impl LayerMix {
    /// Whether layer `l` is a gated linear-attention recurrence (else softmax attention).
    pub fn is_recurrent(self, l: usize) -> bool {
        match self {
            LayerMix::Attention => false,
            LayerMix::Hybrid { attention_every } => !(l + 1).is_multiple_of(attention_every.max(1)),
        }
    }

    /// The layer kinds in the `layer_types` form of recent Hugging Face configs:
    /// "linear_attention" for a recurrent layer, "full_attention" for softmax attention.
    pub fn layer_types(self, layers: usize) -> Vec<&'static str> {
        (0..layers)
            .map(|l| match self.is_recurrent(l) {
                true => "linear_attention",
                false => "full_attention",
            })
            .collect()
    }

    /// Reads `layer_types` back; only the patterns `LayerMix` can express are accepted (the
    /// kernels know no other kind, so anything else must not load as attention silently).
    pub fn from_layer_types(v: &Value, layers: usize) -> Result<Self, String> {
        let kinds: Vec<&str> = v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect())
            .ok_or("layer_types must be a list of strings")?;
        if kinds.len() != layers {
            return Err(format!(
                "layer_types lists {} layers, num_hidden_layers is {layers}",
                kinds.len()
            ));
        }
        if let Some(k) = kinds
            .iter()
            .find(|k| !matches!(**k, "full_attention" | "linear_attention"))
        {
            return Err(format!(
                "layer type {k:?} is not supported (supported: full_attention, linear_attention)"
            ));
        }
        let mix = match kinds.iter().position(|k| *k == "full_attention") {
            _ if !kinds.contains(&"linear_attention") => LayerMix::Attention,
            Some(first) => LayerMix::Hybrid {
                attention_every: first + 1,
            },
            None => return Err("layer_types has no full_attention layer".into()),
        };
        if mix.layer_types(layers) != kinds {
            return Err(format!(
                "layer_types {kinds:?}: only full_attention at every k-th layer (layers k-1, \
                 2k-1, ..) with linear_attention between is supported"
            ));
        }
        Ok(mix)
    }
}

/// Most query heads per kv head the attention kernels take (the MMA's 16 rows).
pub const MAX_GROUP: usize = 16;

/// Rescaling of the rotary frequencies `theta^(-2i/D)` (HF `rope_scaling` /
/// `rope_parameters`, GGUF `rope.scaling.*` and `rope_freqs.weight`).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RopeScaling {
    #[default]
    None,
    /// Every frequency divided by `factor` (positions interpolated; HF `linear`).
    Linear { factor: f32 },
    /// Llama 3.1's frequency-dependent scaling (HF `llama3`): long wavelengths divided by
    /// `factor`, short ones kept, a smooth blend between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: f32,
    },
    /// One divisor per frequency (llama.cpp's `rope_freqs.weight`, which its converter
    /// writes for Llama 3.1).
    Factors(Vec<f32>),
}

/// A shape the CUDA kernels cannot run, or a `config.json` that does not describe one.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error(
        "unknown model shape {0:?} (known: tiny, llama-1b, llama-8b, tiny-hybrid, llama-hybrid-1b)"
    )]
    UnknownName(String),
    #[error("{path}: {msg}")]
    Config { path: String, msg: String },
    #[error("shape {name}: {msg}")]
    Unsupported { name: String, msg: String },
}

impl ModelShape {
    /// A named shape. `llama-1b` has Llama-3.2-1B's dimensions and `llama-8b` Llama-3.1-8B's,
    /// each with its llama3 RoPE scaling.
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
                rope_scaling: RopeScaling::None,
                rms_eps: 1e-5,
                tied_embeddings: false,
                mix: LayerMix::Attention,
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
                rope_scaling: RopeScaling::llama3(32.0),
                rms_eps: 1e-5,
                tied_embeddings: true,
                mix: LayerMix::Attention,
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
                rope_scaling: RopeScaling::llama3(8.0),
                rms_eps: 1e-5,
                tied_embeddings: false,
                mix: LayerMix::Attention,
            },
            // tiny's dimensions over four layers: recurrent, attention, recurrent, attention.
            "tiny-hybrid" => ModelShape {
                name: "tiny-hybrid".into(),
                layers: 4,
                mix: LayerMix::Hybrid { attention_every: 2 },
                ..Self::named("tiny")?
            },
            // Llama-3.2-1B's dimensions with three recurrent layers to each attention layer
            // (the ratio of recent hybrid models): 12 recurrent, 4 attention.
            "llama-hybrid-1b" => ModelShape {
                name: "llama-hybrid-1b".into(),
                mix: LayerMix::Hybrid { attention_every: 4 },
                ..Self::named("llama-1b")?
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
        // transformers 5 keeps the scaling in rope_parameters, 4 in rope_scaling.
        let scaling = v
            .get("rope_parameters")
            .filter(|r| r.is_object())
            .or_else(|| v.get("rope_scaling").filter(|r| r.is_object()));
        let rope_scaling = match scaling {
            None => RopeScaling::None,
            Some(r) => {
                let kind = r
                    .get("rope_type")
                    .or_else(|| r.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let num = |k: &str| -> Result<f32, ShapeError> {
                    r.get(k)
                        .and_then(Value::as_f64)
                        .map(|x| x as f32)
                        .ok_or_else(|| err(format!("rope type {kind:?} needs a number {k:?}")))
                };
                match kind {
                    "default" => RopeScaling::None,
                    "linear" => RopeScaling::Linear {
                        factor: num("factor")?,
                    },
                    "llama3" => RopeScaling::Llama3 {
                        factor: num("factor")?,
                        low_freq_factor: num("low_freq_factor")?,
                        high_freq_factor: num("high_freq_factor")?,
                        original_max_position: num("original_max_position_embeddings")?,
                    },
                    other => {
                        return Err(err(format!(
                            "rope type {other:?} is not supported (supported: default, \
                             linear, llama3)"
                        )))
                    }
                }
            }
        };
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
            rope_scaling,
            rms_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-5) as f32,
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            mix: match v.get("layer_types") {
                None | Some(Value::Null) => LayerMix::Attention,
                Some(t) => LayerMix::from_layer_types(t, int("num_hidden_layers")?).map_err(err)?,
            },
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Checks the limits of the kernels: head_dim 64 or 128, 1..=16 query heads per kv head,
    /// rows that split into 16-byte vectors, a usable RoPE.
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
        if !(1..=MAX_GROUP).contains(&g) {
            return Err(bad(format!(
                "{g} query heads per kv head (supported: 1 to {MAX_GROUP})"
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
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(bad(format!("RoPE base {} must be > 0", self.rope_theta)));
        }
        let ok = match &self.rope_scaling {
            RopeScaling::None => true,
            RopeScaling::Linear { factor } => *factor > 0.0,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                *factor > 0.0
                    && *low_freq_factor > 0.0
                    && high_freq_factor > low_freq_factor
                    && *original_max_position > 0.0
            }
            RopeScaling::Factors(f) => {
                f.len() == self.head_dim / 2 && f.iter().all(|&x| x > 0.0 && x.is_finite())
            }
        };
        if !ok {
            return Err(bad(format!("RoPE scaling {:?}", self.rope_scaling)));
        }
        if let LayerMix::Hybrid { attention_every } = self.mix {
            if attention_every < 2 || attention_every > self.layers {
                return Err(bad(format!(
                    "attention every {attention_every} of {} layers (a hybrid needs 2 to \
                     {} and at least one recurrent layer)",
                    self.layers, self.layers
                )));
            }
        }
        Ok(())
    }

    /// Whether layer `l` is a gated linear-attention recurrence (else softmax attention).
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.mix.is_recurrent(l)
    }

    pub fn recurrent_layers(&self) -> usize {
        (0..self.layers).filter(|&l| self.is_recurrent(l)).count()
    }

    pub fn attention_layers(&self) -> usize {
        self.layers - self.recurrent_layers()
    }

    /// Index of layer `l` among the attention layers (its KV region), `None` for recurrent.
    pub fn kv_layer(&self, l: usize) -> Option<usize> {
        (!self.is_recurrent(l)).then(|| (0..l).filter(|&i| !self.is_recurrent(i)).count())
    }

    /// Index of layer `l` among the recurrent layers (its part of a state), `None` for
    /// attention.
    pub fn state_layer(&self, l: usize) -> Option<usize> {
        self.is_recurrent(l)
            .then(|| (0..l).filter(|&i| self.is_recurrent(i)).count())
    }

    /// f32 values of one recurrent layer's state: head_dim x head_dim per kv head.
    pub fn state_elems_per_layer(&self) -> usize {
        self.kv_heads * self.head_dim * self.head_dim
    }

    /// Bytes of one request's recurrent state over all recurrent layers (0 without any).
    pub fn recurrent_state_bytes(&self) -> u64 {
        (self.recurrent_layers() * self.state_elems_per_layer() * 4) as u64
    }

    /// The rotary frequency of each pair (i, i + D/2): `theta^(-2i/D)`, rescaled. Computed
    /// in f64 and rounded once; the kernels and the CPU reference both read this table.
    pub fn inv_freq(&self) -> Vec<f32> {
        inv_freq_table(self.head_dim, self.rope_theta, &self.rope_scaling)
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
        // A recurrent layer adds its decay projection and bias.
        let decay = self.recurrent_layers() as u64 * (self.kv_heads as u64) * (h + 1);
        v * h + self.layers as u64 * per_layer + h + head + decay
    }

    /// bf16 KV bytes one token occupies across the attention layers.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * self.attention_layers() * self.kv_heads * self.head_dim * 2) as u64
    }
}

/// The rotary frequencies of a head of width `head_dim` (see [`ModelShape::inv_freq`]).
pub fn inv_freq_table(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Vec<f32> {
    let d = head_dim as f64;
    let theta = f64::from(theta);
    (0..head_dim / 2)
        .map(|i| {
            let f = 1.0 / theta.powf((2 * i) as f64 / d);
            scaling.apply(i, f) as f32
        })
        .collect()
}

impl RopeScaling {
    /// Llama 3's published settings with `factor` (8 for 3.1 8B, 32 for 3.2 1B/3B).
    pub fn llama3(factor: f32) -> Self {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192.0,
        }
    }

    /// Frequency `f` of pair `i`, rescaled (transformers' `_compute_llama3_parameters` for
    /// llama3).
    fn apply(&self, i: usize, f: f64) -> f64 {
        match self {
            RopeScaling::None => f,
            RopeScaling::Linear { factor } => f / f64::from(*factor),
            RopeScaling::Factors(div) => f / f64::from(div.get(i).copied().unwrap_or(1.0)),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let (factor, lo, hi, old) = (
                    f64::from(*factor),
                    f64::from(*low_freq_factor),
                    f64::from(*high_freq_factor),
                    f64::from(*original_max_position),
                );
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < old / hi {
                    f
                } else if wavelen > old / lo {
                    f / factor
                } else {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            }
        }
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
    fn hybrid_shapes_interleave_recurrent_and_attention_layers() {
        let t = ModelShape::named("tiny-hybrid").unwrap();
        let kinds: Vec<bool> = (0..t.layers).map(|l| t.is_recurrent(l)).collect();
        assert_eq!(kinds, [true, false, true, false]);
        assert_eq!(
            (t.kv_layer(1), t.kv_layer(3), t.kv_layer(2)),
            (Some(0), Some(1), None)
        );
        assert_eq!(
            (t.state_layer(0), t.state_layer(2), t.state_layer(3)),
            (Some(0), Some(1), None)
        );
        // Two recurrent layers of 2 kv heads x 64 x 64 f32; KV for two layers only.
        assert_eq!(t.recurrent_state_bytes(), 2 * 2 * 64 * 64 * 4);
        assert_eq!(t.kv_bytes_per_token(), 2 * 2 * 2 * 64 * 2);
        let b = ModelShape::named("llama-hybrid-1b").unwrap();
        assert_eq!((b.recurrent_layers(), b.attention_layers()), (12, 4));
        assert!(!b.is_recurrent(3) && !b.is_recurrent(15) && b.is_recurrent(14));
        // 12 layers x 8 kv heads x 64 x 64 x 4 bytes = 1.5 MiB a request.
        assert_eq!(b.recurrent_state_bytes(), 12 * 8 * 64 * 64 * 4);
        assert_eq!(
            b.param_count(),
            ModelShape::named("llama-1b").unwrap().param_count() + 12 * 8 * 2049
        );
        let plain = ModelShape::named("llama-1b").unwrap();
        assert_eq!(plain.recurrent_state_bytes(), 0);
        assert_eq!(plain.state_layer(0), None);
        let bad = ModelShape {
            mix: LayerMix::Hybrid { attention_every: 1 },
            ..t
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("attention every 1"));
    }

    #[test]
    fn every_named_shape_passes_the_kernel_limits() {
        for n in [
            "tiny",
            "llama-1b",
            "llama-8b",
            "tiny-hybrid",
            "llama-hybrid-1b",
        ] {
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
    fn hf_config_layer_types_give_the_hybrid_mix_and_refuse_other_patterns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        let cfg = |types: &str| {
            format!(
                r#"{{"hidden_size":256,"intermediate_size":512,"num_hidden_layers":4,
                   "num_attention_heads":8,"num_key_value_heads":2,"head_dim":64,
                   "vocab_size":1024,"layer_types":{types}}}"#
            )
        };
        let hybrid = LayerMix::Hybrid { attention_every: 2 };
        let types = serde_json::to_string(&hybrid.layer_types(4)).unwrap();
        assert_eq!(
            types,
            r#"["linear_attention","full_attention","linear_attention","full_attention"]"#
        );
        std::fs::write(&p, cfg(&types)).unwrap();
        let s = ModelShape::from_hf_config(&p).unwrap();
        assert_eq!(s.mix, hybrid);
        assert_eq!((s.recurrent_layers(), s.state_layer(2)), (2, Some(1)));
        let all = r#"["full_attention","full_attention","full_attention","full_attention"]"#;
        std::fs::write(&p, cfg(all)).unwrap();
        assert_eq!(
            ModelShape::from_hf_config(&p).unwrap().mix,
            LayerMix::Attention
        );
        for (types, says) in [
            (
                r#"["full_attention","linear_attention","linear_attention","full_attention"]"#,
                "only full_attention at every k-th layer",
            ),
            (
                r#"["linear_attention","sliding_attention","linear_attention","full_attention"]"#,
                "\"sliding_attention\" is not supported",
            ),
            (r#"["linear_attention","full_attention"]"#, "lists 2 layers"),
            (
                r#"["linear_attention","linear_attention","linear_attention","linear_attention"]"#,
                "no full_attention",
            ),
        ] {
            std::fs::write(&p, cfg(types)).unwrap();
            let e = ModelShape::from_hf_config(&p).unwrap_err().to_string();
            assert!(e.contains(says), "{types}: {e}");
        }
    }

    #[test]
    fn every_group_size_up_to_16_passes_including_real_models_shapes() {
        let mut s = ModelShape::named("llama-8b").unwrap();
        for g in 1..=MAX_GROUP {
            s.kv_heads = 1;
            s.heads = g;
            s.validate().unwrap_or_else(|e| panic!("group {g}: {e}"));
        }
        s.heads = 17;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("17 query heads per kv head"), "{e}");
        // SmolLM2-135M (9 over 3, head_dim 64), Qwen2-7B (28 over 4, head_dim 128).
        for (heads, kv, hd, hidden) in [(9, 3, 64, 576), (28, 4, 128, 3584), (32, 8, 128, 4096)] {
            let s = ModelShape {
                heads,
                kv_heads: kv,
                head_dim: hd,
                hidden,
                ..ModelShape::named("tiny").unwrap()
            };
            s.validate().unwrap();
        }
    }

    #[test]
    fn llama3_scaling_keeps_short_wavelengths_divides_long_ones_and_blends_between() {
        let s = ModelShape::named("llama-8b").unwrap();
        let plain = ModelShape {
            rope_scaling: RopeScaling::None,
            ..s.clone()
        }
        .inv_freq();
        let scaled = s.inv_freq();
        assert_eq!(scaled.len(), 64);
        assert_eq!(plain[0], 1.0);
        let mut blended = 0;
        for (i, (&p, &q)) in plain.iter().zip(&scaled).enumerate() {
            let wavelen = 2.0 * std::f64::consts::PI / f64::from(p);
            if wavelen < 8192.0 / 4.0 {
                assert_eq!(q, p, "pair {i} is high-frequency");
            } else if wavelen > 8192.0 {
                assert!((q * 8.0 / p - 1.0).abs() < 1e-6, "pair {i} is divided by 8");
            } else {
                assert!(q < p && q > p / 8.0, "pair {i} blends");
                blended += 1;
            }
        }
        assert!(blended > 0);
        assert!(scaled.windows(2).all(|w| w[1] < w[0]), "still decreasing");
        let lin = ModelShape {
            rope_scaling: RopeScaling::Linear { factor: 4.0 },
            ..s.clone()
        };
        assert_eq!(lin.inv_freq()[5], (f64::from(plain[5]) / 4.0) as f32);
        let mut f = ModelShape {
            rope_scaling: RopeScaling::Factors(vec![2.0; 64]),
            ..s
        };
        assert_eq!(f.inv_freq()[0], 0.5);
        f.rope_scaling = RopeScaling::Factors(vec![2.0; 3]);
        assert!(f
            .validate()
            .unwrap_err()
            .to_string()
            .contains("RoPE scaling"));
    }

    #[test]
    fn hf_config_reads_llama3_scaling_in_both_layouts_and_refuses_yarn() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        let base = r#""hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,
               "num_attention_heads":8,"num_key_value_heads":2,"vocab_size":1024,"head_dim":64"#;
        let llama3 = r#"{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":8192"#;
        for cfg in [
            format!(r#"{{{base},"rope_theta":500000.0,"rope_scaling":{llama3}}}}}"#),
            format!(r#"{{{base},"rope_parameters":{llama3},"rope_theta":500000.0}}}}"#),
        ] {
            std::fs::write(&p, cfg).unwrap();
            let s = ModelShape::from_hf_config(&p).unwrap();
            assert_eq!(s.rope_scaling, RopeScaling::llama3(8.0));
            assert_eq!(s.rope_theta, 500000.0);
        }
        std::fs::write(
            &p,
            format!(r#"{{{base},"rope_scaling":{{"rope_type":"yarn","factor":4.0}}}}"#),
        )
        .unwrap();
        let e = ModelShape::from_hf_config(&p).unwrap_err().to_string();
        assert!(e.contains("yarn") && e.contains("not supported"), "{e}");
        std::fs::write(
            &p,
            format!(r#"{{{base},"rope_scaling":{{"rope_type":"llama3","factor":8.0}}}}"#),
        )
        .unwrap();
        let e = ModelShape::from_hf_config(&p).unwrap_err().to_string();
        assert!(e.contains("low_freq_factor"), "{e}");
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

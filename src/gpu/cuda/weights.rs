//! Model weights in one device slab, bf16, HF layout with q|k|v and gate|up fused so each
//! layer needs two input GEMMs, and the RoPE frequency table. Filled by the seeded init
//! kernel or from a checkpoint (safetensors or GGUF, `ModelFiles`).

use super::device::{Gpu, Which};
use super::init::Tensor;
use super::model_files::ModelFiles;
use super::shape::ModelShape;
use crate::gpu::BackendError;

/// Device pointers of one layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerPtrs {
    pub attn_norm: u64,
    pub qkv: u64,
    pub o: u64,
    pub ffn_norm: u64,
    pub gate_up: u64,
    pub down: u64,
    /// A recurrent layer's decay projection and bias (0 for attention layers).
    pub decay: u64,
    pub decay_bias: u64,
}

pub(crate) struct Weights {
    _slab: super::device::DevBuf,
    _rope: super::device::DevBuf,
    /// f32 [head_dim / 2]: `ModelShape::inv_freq`.
    pub inv_freq: u64,
    pub embed: u64,
    pub layers: Vec<LayerPtrs>,
    pub final_norm: u64,
    pub lm_head: u64,
    pub bytes: usize,
    /// (tensor, device pointer) of every tensor, for filling.
    placement: Vec<(Tensor, u64)>,
}

/// Where a model's weights come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// A named shape (`tiny`, `llama-1b`, `llama-8b`) with seeded random weights.
    Seeded { shape: String, seed: u32 },
    /// A checkpoint: a directory with `config.json` and `*.safetensors` in the HF Llama
    /// layout, or a Llama GGUF file (`ModelFiles::open`).
    Checkpoint(std::path::PathBuf),
}

impl Weights {
    /// Lays out (and zero-allocates) the slab for `s` and uploads its RoPE table.
    pub fn alloc(gpu: &Gpu, s: &ModelShape) -> Result<Self, BackendError> {
        let mut off = 0usize;
        let mut placement: Vec<(Tensor, usize)> = Vec::new();
        let mut place = |t: Tensor, placement: &mut Vec<(Tensor, usize)>| {
            let (r, c) = t.dims(s);
            let at = off;
            // 128-byte granules: q|k|v and gate|up sizes are multiples of 128 bytes (hidden, ffn
            // and head_dim are multiples of 8), so each fused pair stays contiguous.
            off += (r * c * 2).div_ceil(128) * 128;
            placement.push((t, at));
            at
        };
        let embed = place(Tensor::Embed, &mut placement);
        let mut layers = Vec::new();
        for i in 0..s.layers {
            let attn_norm = place(Tensor::AttnNorm(i), &mut placement);
            // q, k, v back to back form the fused [qkv_dim, hidden] matrix.
            let qkv = place(Tensor::Q(i), &mut placement);
            place(Tensor::K(i), &mut placement);
            place(Tensor::V(i), &mut placement);
            let o = place(Tensor::O(i), &mut placement);
            let ffn_norm = place(Tensor::FfnNorm(i), &mut placement);
            let gate_up = place(Tensor::Gate(i), &mut placement);
            place(Tensor::Up(i), &mut placement);
            let down = place(Tensor::Down(i), &mut placement);
            let decay = match s.is_recurrent(i) {
                true => Some((
                    place(Tensor::Decay(i), &mut placement),
                    place(Tensor::DecayBias(i), &mut placement),
                )),
                false => None,
            };
            layers.push((attn_norm, qkv, o, ffn_norm, gate_up, down, decay));
        }
        let final_norm = place(Tensor::FinalNorm, &mut placement);
        let lm_head = if s.tied_embeddings {
            embed
        } else {
            place(Tensor::LmHead, &mut placement)
        };
        let slab = gpu.alloc(off, Which::Decode)?;
        let inv_freq = s.inv_freq();
        let rope = gpu.alloc(inv_freq.len() * 4, Which::Decode)?;
        gpu.htod(Which::Decode, rope.ptr, &inv_freq)?;
        gpu.sync(Which::Decode)?;
        let p = |o: usize| slab.at(o);
        Ok(Weights {
            inv_freq: rope.ptr,
            _rope: rope,
            embed: p(embed),
            layers: layers
                .iter()
                .map(|&(a, q, o, f, g, d, decay)| LayerPtrs {
                    attn_norm: p(a),
                    qkv: p(q),
                    o: p(o),
                    ffn_norm: p(f),
                    gate_up: p(g),
                    down: p(d),
                    decay: decay.map_or(0, |(w, _)| p(w)),
                    decay_bias: decay.map_or(0, |(_, b)| p(b)),
                })
                .collect(),
            final_norm: p(final_norm),
            lm_head: p(lm_head),
            bytes: off,
            placement: placement.iter().map(|&(t, o)| (t, slab.at(o))).collect(),
            _slab: slab,
        })
    }

    /// Seeded init on the device: the values `init::init_tensor_f32` computes on the host.
    pub fn fill_seeded(&self, gpu: &Gpu, s: &ModelShape, seed: u32) -> Result<(), BackendError> {
        for &(t, ptr) in &self.placement {
            let (r, c) = t.dims(s);
            let (scale, offset) = t.init_params(s);
            gpu.init_uniform(
                Which::Decode,
                ptr,
                (r * c) as u64,
                seed,
                t.id(s.layers),
                scale,
                offset,
            )?;
        }
        gpu.sync(Which::Decode)
    }

    /// Copies every tensor from a checkpoint (checked when it was opened), as bf16.
    pub fn fill_from(&self, gpu: &Gpu, files: &ModelFiles) -> Result<(), BackendError> {
        for &(t, ptr) in &self.placement {
            let bits = files
                .tensor_bf16(t)
                .map_err(|e| BackendError::Failed(e.to_string()))?;
            gpu.htod(Which::Decode, ptr, &bits)?;
            // Each copy's host buffer is dropped at the end of this iteration.
            gpu.sync(Which::Decode)?;
        }
        Ok(())
    }
}

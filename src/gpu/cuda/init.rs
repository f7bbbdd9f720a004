//! Seeded weights that the device and the host build bit for bit alike: the host mirror of
//! `kernels/init.cu` (splitmix64 of seed, tensor id and index; no FMA; bf16 round to nearest
//! even). The CPU reference uses it to rebuild exactly the weights the GPU initialised.

use super::shape::ModelShape;

/// Which tensor of the model, in the Hugging Face Llama layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tensor {
    Embed,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// A recurrent layer's decay projection [kv_heads, hidden] and bias [kv_heads].
    Decay(usize),
    DecayBias(usize),
    FinalNorm,
    LmHead,
}

impl Tensor {
    /// Stable id mixed into the hash; distinct for every tensor of a model.
    pub fn id(self, layers: usize) -> u32 {
        let l = |i: usize, k: u32| 1 + 16 * i as u32 + k;
        match self {
            Tensor::Embed => 0,
            Tensor::AttnNorm(i) => l(i, 0),
            Tensor::Q(i) => l(i, 1),
            Tensor::K(i) => l(i, 2),
            Tensor::V(i) => l(i, 3),
            Tensor::O(i) => l(i, 4),
            Tensor::FfnNorm(i) => l(i, 5),
            Tensor::Gate(i) => l(i, 6),
            Tensor::Up(i) => l(i, 7),
            Tensor::Down(i) => l(i, 8),
            Tensor::Decay(i) => l(i, 9),
            Tensor::DecayBias(i) => l(i, 10),
            Tensor::FinalNorm => 1 + 16 * layers as u32,
            Tensor::LmHead => 2 + 16 * layers as u32,
        }
    }

    /// (rows, cols) in the HF layout: linear weights are [out, in].
    pub fn dims(self, s: &ModelShape) -> (usize, usize) {
        let (h, hd) = (s.hidden, s.head_dim);
        match self {
            Tensor::Embed | Tensor::LmHead => (s.vocab, h),
            Tensor::AttnNorm(_) | Tensor::FfnNorm(_) | Tensor::FinalNorm => (1, h),
            Tensor::Q(_) => (s.heads * hd, h),
            Tensor::K(_) | Tensor::V(_) => (s.kv_heads * hd, h),
            Tensor::O(_) => (h, s.heads * hd),
            Tensor::Gate(_) | Tensor::Up(_) => (s.ffn, h),
            Tensor::Down(_) => (h, s.ffn),
            Tensor::Decay(_) => (s.kv_heads, h),
            Tensor::DecayBias(_) => (1, s.kv_heads),
        }
    }

    /// (scale, offset) of the uniform init: norms near 1, linear weights U(-1/sqrt(in),
    /// 1/sqrt(in)) so activations keep their size through the layers, embeddings U(-1, 1).
    pub fn init_params(self, s: &ModelShape) -> (f32, f32) {
        match self {
            Tensor::AttnNorm(_) | Tensor::FfnNorm(_) | Tensor::FinalNorm => (0.1, 1.0),
            Tensor::Embed => (1.0, 0.0),
            // softplus(-3 ± 1) keeps the decay in about (0.88, 0.98): memories of tens of
            // tokens, varying by head and token.
            Tensor::DecayBias(_) => (1.0, -3.0),
            t => (1.0 / (t.dims(s).1 as f32).sqrt(), 0.0),
        }
    }

    /// The HF safetensors name.
    pub fn hf_name(self) -> String {
        let p = |i: usize, n: &str| format!("model.layers.{i}.{n}.weight");
        match self {
            Tensor::Embed => "model.embed_tokens.weight".into(),
            Tensor::AttnNorm(i) => p(i, "input_layernorm"),
            Tensor::Q(i) => p(i, "self_attn.q_proj"),
            Tensor::K(i) => p(i, "self_attn.k_proj"),
            Tensor::V(i) => p(i, "self_attn.v_proj"),
            Tensor::O(i) => p(i, "self_attn.o_proj"),
            Tensor::FfnNorm(i) => p(i, "post_attention_layernorm"),
            Tensor::Gate(i) => p(i, "mlp.gate_proj"),
            Tensor::Up(i) => p(i, "mlp.up_proj"),
            Tensor::Down(i) => p(i, "mlp.down_proj"),
            Tensor::Decay(i) => p(i, "linear_attn.decay_proj"),
            Tensor::DecayBias(i) => format!("model.layers.{i}.linear_attn.decay_proj.bias"),
            Tensor::FinalNorm => "model.norm.weight".into(),
            Tensor::LmHead => "lm_head.weight".into(),
        }
    }
}

/// splitmix64, as in `kernels/init.cu`.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Round an f32 to bf16 bits, nearest even (the kernels' `f2bf`).
pub fn f32_to_bf16_bits(f: f32) -> u16 {
    let b = f.to_bits();
    if b & 0x7f80_0000 == 0x7f80_0000 {
        return ((b >> 16) | if b & 0xffff != 0 { 0x40 } else { 0 }) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Round an f32 through bf16 and back.
pub fn round_bf16(f: f32) -> f32 {
    bf16_bits_to_f32(f32_to_bf16_bits(f))
}

/// Element `i` of tensor `tensor` as bf16 bits: the device's `init_uniform_bf16`.
pub fn uniform_value(seed: u32, tensor: u32, i: u64, scale: f32, offset: f32) -> u16 {
    let z = splitmix64(((seed as u64) << 48) ^ ((tensor as u64) << 36) ^ i);
    let u = ((z >> 40) as u32) as f32 * (1.0 / 16_777_216.0);
    let v = 2.0f32 * u - 1.0;
    f32_to_bf16_bits(offset + scale * v)
}

/// A whole tensor as f32 values (each exactly a bf16), in the HF layout.
pub fn init_tensor_f32(s: &ModelShape, seed: u32, t: Tensor) -> Vec<f32> {
    let (r, c) = t.dims(s);
    let (scale, offset) = t.init_params(s);
    let id = t.id(s.layers);
    (0..(r * c) as u64)
        .map(|i| bf16_bits_to_f32(uniform_value(seed, id, i, scale, offset)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        let one = 1.0f32.to_bits();
        // Exactly half way between 1.0 and the next bf16 (1 + 2^-7): ties go to the even 1.0.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(one + 0x8000)), 0x3f80);
        // Half way above an odd mantissa rounds up to the even one.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(one + 0x1_8000)), 0x3f82);
        // Just above half way rounds up.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(one + 0x8001)), 0x3f81);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn uniform_init_stays_in_range_and_depends_on_seed_and_tensor() {
        let vals: Vec<f32> = (0..4096)
            .map(|i| bf16_bits_to_f32(uniform_value(7, 3, i, 0.5, 1.0)))
            .collect();
        assert!(vals.iter().all(|v| (0.5..=1.5).contains(v)));
        let mean = vals.iter().sum::<f32>() / vals.len() as f32;
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        let a: Vec<u16> = (0..64).map(|i| uniform_value(7, 3, i, 1.0, 0.0)).collect();
        let b: Vec<u16> = (0..64).map(|i| uniform_value(8, 3, i, 1.0, 0.0)).collect();
        let c: Vec<u16> = (0..64).map(|i| uniform_value(7, 4, i, 1.0, 0.0)).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a,
            (0..64)
                .map(|i| uniform_value(7, 3, i, 1.0, 0.0))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn tensor_ids_are_distinct_within_a_model() {
        let s = ModelShape::named("tiny").unwrap();
        let mut ids = vec![
            Tensor::Embed.id(2),
            Tensor::FinalNorm.id(2),
            Tensor::LmHead.id(2),
        ];
        for l in 0..2 {
            for t in [
                Tensor::AttnNorm(l),
                Tensor::Q(l),
                Tensor::K(l),
                Tensor::V(l),
                Tensor::O(l),
                Tensor::FfnNorm(l),
                Tensor::Gate(l),
                Tensor::Up(l),
                Tensor::Down(l),
                Tensor::Decay(l),
                Tensor::DecayBias(l),
            ] {
                ids.push(t.id(s.layers));
            }
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
}

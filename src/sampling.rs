//! Per-request sampling parameters (SPEC §6, §7). The HTTP layer validates and fills them;
//! they travel with the request to the step backend, which samples on the device (the
//! timing-model backend has no logits and ignores them).

/// How a backend picks the next token from a request's logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability
    /// reaches this; 1 = off.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 = off.
    pub top_k: u32,
    /// Seed of this request's random stream: the same seed, prompt and parameters give the
    /// same tokens run to run. `None`: the backend derives one from the request id.
    pub seed: Option<u64>,
}

impl SamplingParams {
    /// Argmax decoding, what a request gets when it asks for nothing else.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: None,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::GREEDY
    }
}

//! The timing formulas of the plant around a GEN worker (SPEC §8.2): the decode step time
//! `t(B, ΣL)`, the KV transfer from a context server, and a context server's prefill. The
//! `model` step backend sleeps (or advances a clock) by them, and the simulator schedules its
//! events by them.

use serde::Serialize;

use crate::config::TimingConfig;

/// Decode step time `t(B, ΣL) = base + B·per_request + ΣL·per_kv_token`, plus, when
/// `B > jump_above`, `jump + (B − jump_above)·per_request_above` (a step jump and a steeper
/// slope past it, as when a batch spills into a second wave of kernel tiles).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepModel {
    pub base_ms: f64,
    pub per_request_ms: f64,
    pub per_kv_token_ns: f64,
    pub jump_above: Option<u32>,
    pub jump_ms: f64,
    /// Extra ms per request past `jump_above`.
    pub per_request_above_ms: f64,
    /// Output tokens per request per step (> 1 with speculative decoding; fractional = mean).
    pub tokens_per_step: f64,
}

impl StepModel {
    pub fn step_s(&self, batch: usize, kv_tokens: u64) -> f64 {
        let mut ms = self.base_ms
            + batch as f64 * self.per_request_ms
            + kv_tokens as f64 * self.per_kv_token_ns * 1e-6;
        if let Some(j) = self.jump_above.filter(|&j| batch as u32 > j) {
            ms += self.jump_ms + f64::from(batch as u32 - j) * self.per_request_above_ms;
        }
        ms * 1e-3
    }
}

/// KV transfer from the context server: `base + tokens · per_token`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TransferModel {
    pub base_ms: f64,
    pub per_token_us: f64,
}

impl TransferModel {
    pub fn transfer_s(&self, context_tokens: u32) -> f64 {
        (self.base_ms + context_tokens as f64 * self.per_token_us * 1e-3) * 1e-3
    }
}

/// Context (prefill) servers: `servers` in parallel, FIFO; a prefill costs
/// `base + uncached tokens · per_token` (prefix-cache hits are free).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ContextModel {
    pub servers: u32,
    pub base_ms: f64,
    pub per_token_us: f64,
}

impl ContextModel {
    pub fn prefill_s(&self, uncached_tokens: u32) -> f64 {
        (self.base_ms + uncached_tokens as f64 * self.per_token_us * 1e-3) * 1e-3
    }
}

impl StepModel {
    /// The step model a config's `timing` section describes.
    pub fn from_timing(t: &TimingConfig) -> Self {
        StepModel {
            base_ms: t.base_ms,
            per_request_ms: t.per_request_ms,
            per_kv_token_ns: t.per_kv_token_ns,
            jump_above: t.jump_above,
            jump_ms: t.jump_ms,
            per_request_above_ms: t.per_request_above_ms,
            tokens_per_step: t.tokens_per_step,
        }
    }

    /// The same step `factor` times as long at every batch and context: each time term
    /// scaled, the jump's threshold and the tokens a step kept (a card slower or faster than
    /// the one the model was fitted on; `sim --step-scale`).
    pub fn scaled(&self, factor: f64) -> Self {
        StepModel {
            base_ms: self.base_ms * factor,
            per_request_ms: self.per_request_ms * factor,
            per_kv_token_ns: self.per_kv_token_ns * factor,
            jump_ms: self.jump_ms * factor,
            per_request_above_ms: self.per_request_above_ms * factor,
            ..*self
        }
    }
}

impl TransferModel {
    /// The transfer model a config's `timing` section describes.
    pub fn from_timing(t: &TimingConfig) -> Self {
        TransferModel {
            base_ms: t.transfer_base_ms,
            per_token_us: t.transfer_per_token_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_adds_the_jump_and_the_steeper_slope_only_above_the_threshold() {
        let m = StepModel {
            base_ms: 80.0,
            per_request_ms: 0.05,
            per_kv_token_ns: 0.5,
            jump_above: Some(128),
            jump_ms: 10.0,
            per_request_above_ms: 0.5,
            tokens_per_step: 1.0,
        };
        let at128 = m.step_s(128, 1_000_000);
        let at129 = m.step_s(129, 1_000_000);
        let at140 = m.step_s(140, 1_000_000);
        assert!((at128 - (80.0 + 6.4 + 0.5) * 1e-3).abs() < 1e-12);
        assert!((at129 - at128 - (0.05 + 10.0 + 0.5) * 1e-3).abs() < 1e-12);
        assert!((at140 - at129 - 11.0 * (0.05 + 0.5) * 1e-3).abs() < 1e-12);
    }

    #[test]
    fn a_scaled_step_is_that_many_times_as_long_on_both_sides_of_the_jump() {
        let m = StepModel {
            base_ms: 4.5,
            per_request_ms: 0.006,
            per_kv_token_ns: 31.6,
            jump_above: Some(64),
            jump_ms: 1.5,
            per_request_above_ms: 0.02,
            tokens_per_step: 1.3,
        };
        let s = m.scaled(1.045);
        for (batch, kv) in [(1, 4096), (64, 262_144), (65, 266_240), (128, 524_288)] {
            let (a, b) = (m.step_s(batch, kv), s.step_s(batch, kv));
            assert!(
                (b / a - 1.045).abs() < 1e-12,
                "batch {batch}: {b} against {a}"
            );
        }
        assert_eq!((s.jump_above, s.tokens_per_step), (Some(64), 1.3));
    }
}

//! The modelled plant around the GEN worker (SPEC §8.2): its timing models (the
//! formulas live in `crate::timing`), the worker's shape, and the replay's knobs.

use serde::Serialize;

use crate::config::TimingConfig;
use crate::timing::{ContextModel, StepModel, TransferModel};

/// Everything the simulator models, plus the GEN worker's shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plant {
    pub name: String,
    pub step: StepModel,
    pub transfer: TransferModel,
    pub context: ContextModel,
    pub max_batch_size: u32,
    pub kv_tokens: u64,
    /// Recorded output lengths are multiplied by this (1 = as recorded). The reference preset
    /// uses it to match the reference run's longer outputs (docs/results.md).
    pub output_scale: f64,
    /// AgentX replay: idle cap on gaps (s) and the start-point fraction range.
    pub idle_cap_s: f64,
    pub start_fraction: (f64, f64),
    /// AgentX replay: each completion's lane waits a seeded delay uniform in [0, this) s
    /// before its next send (loadgen's `--send-jitter`, the same draw: `workload::jitter`).
    pub send_jitter_s: f64,
}

impl Plant {
    /// The plant a config's `timing` section describes (the `model` backend's).
    pub fn from_timing(name: &str, t: &TimingConfig, max_batch_size: u32, kv_tokens: u64) -> Self {
        Plant {
            name: name.into(),
            step: StepModel::from_timing(t),
            transfer: TransferModel::from_timing(t),
            context: ContextModel {
                servers: 8,
                base_ms: 20.0,
                per_token_us: t.prefill_per_token_us.max(20.0),
            },
            max_batch_size,
            kv_tokens,
            output_scale: 1.0,
            idle_cap_s: 10.0,
            start_fraction: (0.0, 1.0),
            send_jitter_s: 0.0,
        }
    }
}

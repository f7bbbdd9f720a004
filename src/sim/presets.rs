//! Plant presets. `reference` is calibrated so its control arm lands near the reference's
//! GPU control (Kimi-K3, GB300, GEN helix-CP16 + MTP, batch 128, AgentX c220): TTFT p50
//! ≈ 10 s, p90 ≈ 13.5 s, mean TPOT ≈ 24 ms, step ≈ 90 ms at 125–128 requests, ≈ 102 ms at
//! 129 and ≈ 110 ms at 141–144. How each number was chosen is in docs/results.md.

use crate::config::Config;

use super::plant::{ContextModel, Plant, StepModel, TransferModel};

pub const NAMES: &[&str] = &["reference", "default"];

pub fn preset(name: &str) -> Option<Plant> {
    match name {
        "reference" => Some(reference()),
        "default" => {
            let c = Config::default();
            Some(Plant::from_timing(
                "default",
                &c.timing,
                c.max_batch_size,
                c.kv_cache_config.max_tokens,
            ))
        }
        _ => None,
    }
}

/// The reference setting. Step: 85 ms + 0.03 ms per request + 0.1 ns per KV token in the
/// batch (≈ 90 ms at 128 requests of ~120k-token contexts), +11 ms above 128 requests
/// (≈ 102 ms at 129, ≈ 102.5 ms at 144 before its KV term), 3.75 tokens per step (MTP:
/// TPOT ≈ 24 ms). KV transfer 20 ms + 0.5 µs per context token. Four context servers,
/// 40 ms + 25 µs per uncached prompt token. Recorded outputs × 2.5 (the reference's E2E p90
/// of 68 s at 24 ms TPOT implies outputs about 2.5× the Weka subset's) and an AgentX idle cap
/// of 5 s, chosen by a scan (docs/results.md) so the control lands at TTFT p50 ≈ 9.7 s and
/// p90 ≈ 13.7 s on the Weka traces. Start point uniform over 0–100 %.
pub fn reference() -> Plant {
    Plant {
        name: "reference".into(),
        step: StepModel {
            base_ms: 85.0,
            per_request_ms: 0.03,
            per_kv_token_ns: 0.1,
            jump_above: Some(128),
            jump_ms: 11.0,
            tokens_per_step: 3.75,
        },
        transfer: TransferModel {
            base_ms: 20.0,
            per_token_us: 0.5,
        },
        context: ContextModel {
            servers: 4,
            base_ms: 40.0,
            per_token_us: 25.0,
        },
        max_batch_size: 128,
        kv_tokens: 200_000_000,
        output_scale: 2.5,
        idle_cap_s: 5.0,
        start_fraction: (0.0, 1.0),
    }
}

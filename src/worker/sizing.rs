//! From a validated config to a sized worker: the setup decision of SPEC §4.4 runs first,
//! and only a worker that will preempt reserves the paused cap as headroom.

use crate::config::Config;
use crate::policy::setup::{self, SetupDecision, SetupError, SetupInputs};
use crate::pools::{KvConfig, PoolReport};

use super::WorkerParams;

/// Default recurrent-state size per request when a hybrid model does not say (bytes).
const DEFAULT_RECURRENT_STATE_BYTES: u64 = 4 << 20;

fn kv_config(cfg: &Config, rows: u32, headroom: u32) -> KvConfig {
    let tpb = cfg.kv_cache_config.tokens_per_block.max(1);
    KvConfig {
        tokens_per_block: tpb,
        total_pages: (cfg.kv_cache_config.max_tokens / tpb as u64).min(u32::MAX as u64) as u32,
        index_rows: rows,
        sliding_window: cfg.kv_cache_config.sliding_window,
        headroom_rows: headroom,
    }
}

/// What each pool could hold if sized for `max_active + headroom` residents. Pools whose
/// size the operator fixed (recurrent slots, drafter slots, KV tokens) report that size.
pub fn pool_reports(cfg: &Config, headroom: u32) -> Vec<PoolReport> {
    let max_active = cfg.max_num_active_requests();
    let rows = max_active + headroom;
    let mut v = vec![
        PoolReport {
            pool: "sequence_slots",
            resident_capacity: rows as u64,
        },
        PoolReport {
            pool: "kv",
            resident_capacity: kv_config(cfg, rows, headroom).resident_capacity(),
        },
    ];
    if let Some(n) = cfg.recurrent_state.slots {
        v.push(PoolReport {
            pool: "recurrent_state",
            resident_capacity: n as u64,
        });
    }
    if let Some(n) = cfg.drafter.slots {
        v.push(PoolReport {
            pool: "drafter",
            resident_capacity: n as u64,
        });
    }
    v
}

/// Tokens a row gains per step, and so the KV it must hold after one: the timing model's
/// mean, or with a drafter the verify pass's k + 1 positions (it writes KV for all of them).
fn tokens_per_step(cfg: &Config) -> u32 {
    let timed = cfg.timing.tokens_per_step.round().max(1.0) as u32;
    match cfg.drafter.slots {
        Some(_) => timed.max(cfg.drafter.max_draft_len + 1),
        None => timed,
    }
}

/// Decide (§4.4), then size every pool for the decision.
pub fn resolve(cfg: &Config) -> Result<(WorkerParams, SetupDecision), SetupError> {
    let max_active = cfg.max_num_active_requests();
    let mode = cfg.preemption().unwrap_or(crate::policy::Mode::Off);
    let adm = &cfg.scheduler_config.gen_admission;
    let decision = setup::decide(
        &SetupInputs {
            mode,
            policy: adm.policy,
            pipeline_parallel_size: cfg.parallel.pipeline_parallel_size,
            enable_attention_dp: cfg.parallel.enable_attention_dp,
            max_active,
        },
        |h| pool_reports(cfg, h),
    )?;
    let headroom = decision.headroom;
    let rows = max_active + headroom;
    let params = WorkerParams {
        max_batch_size: cfg.max_batch_size,
        max_active,
        max_num_tokens: cfg.max_num_tokens,
        tokens_per_step: tokens_per_step(cfg),
        admission: cfg.admission(),
        mode: decision.mode,
        victim_key: Default::default(),
        g0: cfg
            .scheduler_config
            .gen_preemption
            .initial_gain
            .unwrap_or(crate::policy::preemption::controller::G_START),
        gain_from: cfg
            .scheduler_config
            .gen_preemption
            .gain_from
            .unwrap_or_default(),
        pause_limits: Default::default(),
        headroom,
        kv: kv_config(cfg, rows, headroom),
        recurrent_state_bytes: cfg
            .recurrent_state
            .slots
            .map(|_| DEFAULT_RECURRENT_STATE_BYTES),
        drafter_window: cfg.drafter.slots.map(|_| cfg.drafter.window_tokens),
    };
    Ok((params, decision))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::preemption::controller::GainFrom;
    use crate::policy::setup::OffReason;
    use crate::policy::Mode;

    fn cfg(yaml: &str) -> Config {
        Config::from_yaml_str(yaml, "test").expect("valid config")
    }

    #[test]
    fn preemption_on_sizes_pools_with_the_paused_cap() {
        let (p, d) = resolve(&cfg(
            "scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }",
        ))
        .unwrap();
        assert_eq!(d.mode, Mode::TpotBudget(0.1));
        assert_eq!(p.headroom, 48);
        assert_eq!(p.kv.index_rows, 176);
        assert_eq!(p.residents_capacity(), 176);
    }

    #[test]
    fn the_gain_rule_and_start_reach_the_worker_as_configured() {
        let (p, _) = resolve(&cfg(
            "scheduler_config: { gen_preemption: { tpot_budget: 0.1, initial_gain: 0.5, gain_from: paused } }",
        ))
        .unwrap();
        assert_eq!((p.g0, p.gain_from), (0.5, GainFrom::Paused));
        let (p, _) = resolve(&cfg(
            "scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }",
        ))
        .unwrap();
        assert_eq!((p.g0, p.gain_from), (1.0, GainFrom::Any), "SPEC §4.3's");
    }

    #[test]
    fn preemption_off_reserves_nothing() {
        let (p, d) = resolve(&Config::default()).unwrap();
        assert_eq!(d.mode, Mode::Off);
        assert_eq!(p.headroom, 0);
        assert_eq!(p.kv.index_rows, 128);
    }

    #[test]
    fn a_kv_pool_too_small_for_the_headroom_disables_preemption_with_one_warning() {
        let c = cfg("kv_cache_config: { max_tokens: 4096 }\nscheduler_config: { gen_preemption: { tpot_budget: 0.1 } }");
        let (p, d) = resolve(&c).unwrap();
        assert_eq!(d.mode, Mode::Off);
        assert_eq!(p.headroom, 0);
        assert_eq!(
            d.warning,
            Some(OffReason::PoolShort {
                pool: "kv",
                capacity: 128,
                need: 176
            })
        );
    }

    #[test]
    fn recurrent_and_drafter_pools_hold_the_paused_cap_as_headroom() {
        let c = cfg("max_batch_size: 8\nrecurrent_state: { slots: 11 }\n\
             drafter: { slots: 11, window_tokens: 64, max_draft_len: 4 }\n\
             scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }");
        let (p, d) = resolve(&c).unwrap();
        assert_eq!((d.mode, p.headroom), (Mode::TpotBudget(0.1), 3));
        assert_eq!(
            p.tokens_per_step, 5,
            "the verify pass writes k + 1 positions"
        );
        let core = crate::worker::WorkerCore::new(p);
        let usage = core.pool_usage();
        for pool in ["sequence_slots", "recurrent_state", "drafter"] {
            let u = usage.iter().find(|u| u.pool == pool).unwrap();
            assert_eq!((u.capacity, u.headroom), (11, 3), "{pool}");
        }
        let arena = core.drafter().unwrap().layout();
        assert_eq!((arena.request_slots, arena.scratch_slots), (11, 8));
        // One slot short of 8 + 3: preemption stays off and nothing is reserved.
        let short = cfg(
            "max_batch_size: 8\ndrafter: { slots: 10, window_tokens: 8 }\n\
             scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }",
        );
        let (p, d) = resolve(&short).unwrap();
        assert_eq!((d.mode, p.headroom), (Mode::Off, 0));
        assert_eq!(
            d.warning,
            Some(OffReason::PoolShort {
                pool: "drafter",
                capacity: 10,
                need: 11
            })
        );
    }

    #[test]
    fn a_short_recurrent_pool_disables_preemption() {
        let c = cfg("recurrent_state: { slots: 150 }\nscheduler_config: { gen_preemption: { target_output_tps: 30 } }");
        let (_, d) = resolve(&c).unwrap();
        assert_eq!(
            d.warning,
            Some(OffReason::PoolShort {
                pool: "recurrent_state",
                capacity: 150,
                need: 176
            })
        );
    }
}

//! The setup decision (SPEC §4.4): whether preemption runs, decided **before** any pool is
//! sized, so a worker that will not preempt carries no headroom. Pure: the caller says what
//! each pool could hold if sized with the paused cap's headroom.

use serde::Serialize;

use super::admission::AdmissionPolicy;
use super::preemption::{paused_cap, Mode};

/// How many resident requests a pool can hold: what the decision asks of each pool (the
/// pools answer with it; this module never sees a pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolReport {
    pub pool: &'static str,
    pub resident_capacity: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SetupInputs {
    pub mode: Mode,
    pub policy: AdmissionPolicy,
    pub pipeline_parallel_size: u32,
    pub enable_attention_dp: bool,
    pub max_active: u32,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SetupError {
    #[error(
        "scheduler_config.gen_preemption cannot run with parallel.pipeline_parallel_size = {0} (> 1): \
         pipeline-parallel pools reserve no paused-request headroom"
    )]
    PipelineParallel(u32),
}

/// Why preemption is off although it was configured.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum OffReason {
    AttentionDp,
    AdmissionPolicy {
        policy: AdmissionPolicy,
    },
    PoolShort {
        pool: &'static str,
        capacity: u64,
        need: u64,
    },
    /// Turned off at run time (actor failure, operator call).
    Disabled {
        why: String,
    },
}

impl OffReason {
    /// The one warning line logged for it.
    pub fn message(&self) -> String {
        match self {
            OffReason::AttentionDp => {
                "GEN slot preemption disabled: enable_attention_dp is on (per-rank queues cannot pause in step)".into()
            }
            OffReason::AdmissionPolicy { policy } => format!(
                "GEN slot preemption disabled: it needs gen_admission.policy = auto, the configured policy is {}",
                super::names::name(policy)
            ),
            OffReason::PoolShort { pool, capacity, need } => format!(
                "GEN slot preemption disabled: the {pool} pool holds {capacity} resident requests, \
                 it needs {need} (max_num_active_requests + paused cap)"
            ),
            OffReason::Disabled { why } => format!("GEN slot preemption disabled at run time: {why}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetupDecision {
    /// The mode that runs (Off when disabled).
    pub mode: Mode,
    /// Headroom each per-resident pool reserves: the paused cap when on, else 0.
    pub headroom: u32,
    /// At most one warning, when preemption was configured but stays off.
    pub warning: Option<OffReason>,
}

/// Decide whether preemption runs. `capacity_with_headroom(h)` reports what each pool could
/// hold if sized for `max_active + h` residents; it is only called when preemption
/// survived the configuration checks.
pub fn decide(
    inputs: &SetupInputs,
    capacity_with_headroom: impl FnOnce(u32) -> Vec<PoolReport>,
) -> Result<SetupDecision, SetupError> {
    let off = |warning| SetupDecision {
        mode: Mode::Off,
        headroom: 0,
        warning,
    };
    if !inputs.mode.is_on() {
        return Ok(off(None));
    }
    if inputs.pipeline_parallel_size > 1 {
        return Err(SetupError::PipelineParallel(inputs.pipeline_parallel_size));
    }
    if inputs.enable_attention_dp {
        return Ok(off(Some(OffReason::AttentionDp)));
    }
    if inputs.policy != AdmissionPolicy::Auto {
        return Ok(off(Some(OffReason::AdmissionPolicy {
            policy: inputs.policy,
        })));
    }
    let cap = paused_cap(inputs.max_active);
    let need = inputs.max_active as u64 + cap as u64;
    if let Some(short) = capacity_with_headroom(cap)
        .into_iter()
        .find(|r| r.resident_capacity < need)
    {
        return Ok(off(Some(OffReason::PoolShort {
            pool: short.pool,
            capacity: short.resident_capacity,
            need,
        })));
    }
    Ok(SetupDecision {
        mode: inputs.mode,
        headroom: cap,
        warning: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(mode: Mode) -> SetupInputs {
        SetupInputs {
            mode,
            policy: AdmissionPolicy::Auto,
            pipeline_parallel_size: 1,
            enable_attention_dp: false,
            max_active: 128,
        }
    }

    fn roomy(h: u32) -> Vec<PoolReport> {
        vec![
            PoolReport {
                pool: "sequence_slots",
                resident_capacity: 128 + h as u64,
            },
            PoolReport {
                pool: "kv",
                resident_capacity: 10_000,
            },
        ]
    }

    #[test]
    fn off_when_not_configured_and_no_pool_is_asked() {
        let d = decide(&inputs(Mode::Off), |_| {
            panic!("pools must not be sized for headroom")
        })
        .unwrap();
        assert_eq!(
            d,
            SetupDecision {
                mode: Mode::Off,
                headroom: 0,
                warning: None
            }
        );
    }

    #[test]
    fn enabled_reserves_the_paused_cap() {
        let d = decide(&inputs(Mode::TpotBudget(0.1)), roomy).unwrap();
        assert_eq!(d.mode, Mode::TpotBudget(0.1));
        assert_eq!(d.headroom, 48);
        assert_eq!(d.warning, None);
    }

    #[test]
    fn pipeline_parallel_is_an_error() {
        let i = SetupInputs {
            pipeline_parallel_size: 2,
            ..inputs(Mode::TargetOutputTps(30.0))
        };
        assert_eq!(decide(&i, roomy), Err(SetupError::PipelineParallel(2)));
    }

    #[test]
    fn attention_dp_stays_off_with_one_warning_and_no_headroom() {
        let i = SetupInputs {
            enable_attention_dp: true,
            ..inputs(Mode::TpotBudget(0.1))
        };
        let d = decide(&i, |_| panic!("not sized")).unwrap();
        assert_eq!(
            (d.mode, d.headroom, d.warning),
            (Mode::Off, 0, Some(OffReason::AttentionDp))
        );
    }

    #[test]
    fn non_auto_admission_policy_stays_off_with_one_warning() {
        for policy in [AdmissionPolicy::Fcfs, AdmissionPolicy::Edf] {
            let i = SetupInputs {
                policy,
                ..inputs(Mode::TpotBudget(0.1))
            };
            let d = decide(&i, |_| panic!("not sized")).unwrap();
            assert_eq!(d.warning, Some(OffReason::AdmissionPolicy { policy }));
            assert!(d.warning.unwrap().message().contains("policy"));
        }
    }

    #[test]
    fn a_short_pool_disables_with_one_warning_naming_pool_capacity_and_need() {
        let d = decide(&inputs(Mode::TpotBudget(0.1)), |_| {
            vec![
                PoolReport {
                    pool: "sequence_slots",
                    resident_capacity: 176,
                },
                PoolReport {
                    pool: "recurrent_state",
                    resident_capacity: 150,
                },
                PoolReport {
                    pool: "kv",
                    resident_capacity: 100,
                },
            ]
        })
        .unwrap();
        assert_eq!(d.mode, Mode::Off);
        assert_eq!(d.headroom, 0);
        let w = d.warning.unwrap();
        assert_eq!(
            w,
            OffReason::PoolShort {
                pool: "recurrent_state",
                capacity: 150,
                need: 176
            }
        );
        let m = w.message();
        assert!(
            m.contains("recurrent_state") && m.contains("150") && m.contains("176"),
            "{m}"
        );
    }
}

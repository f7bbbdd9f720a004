//! A serialisable view of the worker's components (the `/debug/actors` payload's core).

use serde::Serialize;

use super::WorkerCore;
use crate::policy::admission::{Head, Tier};
use crate::policy::preemption::{Mode, PausedView, Totals};
use crate::policy::RequestId;
use crate::pools::PoolUsage;

#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    pub len: usize,
    pub max_waiting: usize,
    pub policy: crate::policy::AdmissionPolicy,
    pub target_x_s: Option<f64>,
    pub target_samples: usize,
    pub tiers: TierCounts,
    pub head: Option<Head>,
    pub mean_step_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TierCounts {
    pub late: usize,
    pub guard: usize,
    pub on_time: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PreemptionView {
    pub mode: Mode,
    pub paused: Vec<PausedView>,
    pub paused_cap: u32,
    pub g: Option<f64>,
    pub window_s: f64,
    pub d_s: Option<f64>,
    pub r0_tps: Option<f64>,
    pub credit: Option<f64>,
    pub completions: u64,
    pub totals: Totals,
}

#[derive(Debug, Clone, Serialize)]
pub struct ResidentView {
    pub id: RequestId,
    pub state: &'static str,
    pub output_tokens: u32,
    pub max_tokens: u32,
    pub pauses: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerSnapshot {
    pub now: f64,
    pub pass: u64,
    pub queue: QueueView,
    pub preemption: PreemptionView,
    pub pools: Vec<PoolUsage>,
    pub residents: usize,
    pub active: usize,
    pub displaced: Vec<RequestId>,
    pub last_batch: usize,
    pub totals: super::WorkerTotals,
}

pub(super) fn build(w: &WorkerCore, now: f64) -> WorkerSnapshot {
    let (late, guard, on_time) = w.queue.tier_counts();
    let p = &w.preempt;
    let paused = p.paused_count();
    WorkerSnapshot {
        now,
        pass: w.pass_no,
        queue: QueueView {
            len: w.queue.len(),
            max_waiting: w.queue.params().max_waiting,
            policy: w.queue.params().policy,
            target_x_s: w.queue.target(),
            target_samples: w.queue.target_samples(),
            tiers: TierCounts {
                late,
                guard,
                on_time,
            },
            head: w
                .queue
                .head()
                .filter(|h| h.tier != Tier::NoTarget || w.queue.target().is_none()),
            mean_step_s: w.queue.mean_step(),
        },
        preemption: PreemptionView {
            mode: p.mode(),
            paused: p.paused_view(now),
            paused_cap: p.paused_cap(),
            g: p.g(),
            window_s: p.window(),
            d_s: p.d(),
            r0_tps: p.stats().r0(),
            credit: p.credit(),
            completions: p.stats().completions(),
            totals: p.totals(),
        },
        pools: w.pool_usage(),
        residents: w.residents.len(),
        active: w.residents.len() - paused,
        displaced: w.displaced.clone(),
        last_batch: w.last_batch,
        totals: w.totals,
    }
}

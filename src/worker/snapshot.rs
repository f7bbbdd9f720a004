//! A serialisable view of the worker's components (the `/debug/actors` payload's core).

use serde::Serialize;

use super::{PassMachine, WorkerCore};
use crate::ids::RequestId;
use crate::policy::admission::{AdmissionQueue, Head, Tier, TierCounts};
use crate::policy::preemption::{GenPreemption, Mode, PausedView, Totals};
use crate::pools::PoolUsage;

#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    pub len: usize,
    pub max_waiting: usize,
    pub policy: crate::policy::AdmissionPolicy,
    pub target_x_s: Option<f64>,
    pub target_samples: usize,
    /// Waited TTFTs X needs before it forms (`gen_admission.min_samples`).
    pub min_samples: usize,
    pub tiers: TierCounts,
    pub head: Option<Head>,
    pub mean_step_s: f64,
    /// s2f's transfer part: the line fitted to observed admit → KV-ready times.
    pub transfer: TransferView,
}

#[derive(Debug, Clone, Serialize)]
pub struct TransferView {
    pub base_s: f64,
    pub per_token_us: f64,
    pub samples: u64,
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

impl QueueView {
    pub fn of(q: &AdmissionQueue) -> Self {
        QueueView {
            len: q.len(),
            max_waiting: q.params().max_waiting,
            policy: q.params().policy,
            target_x_s: q.target(),
            target_samples: q.target_samples(),
            min_samples: q.params().min_samples,
            tiers: q.tier_counts(),
            head: q
                .head()
                .filter(|h| h.tier != Tier::NoTarget || q.target().is_none()),
            mean_step_s: q.mean_step(),
            transfer: {
                let (line, samples) = q.transfer_estimate();
                TransferView {
                    base_s: line.intercept,
                    per_token_us: line.slope * 1e6,
                    samples,
                }
            },
        }
    }
}

impl PreemptionView {
    pub fn of(p: &GenPreemption, now: f64) -> Self {
        PreemptionView {
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
        }
    }
}

impl PassMachine {
    /// The worker's snapshot from the machine's state and the components' views.
    pub fn snapshot(
        &self,
        now: f64,
        queue: QueueView,
        preemption: PreemptionView,
        pools: Vec<PoolUsage>,
    ) -> WorkerSnapshot {
        let paused = preemption.paused.len();
        WorkerSnapshot {
            now,
            pass: self.pass_no,
            queue,
            preemption,
            pools,
            residents: self.residents.len(),
            active: self.residents.len().saturating_sub(paused),
            displaced: self.displaced.clone(),
            last_batch: self.last_batch,
            totals: self.totals,
        }
    }
}

pub(super) fn build(w: &WorkerCore, now: f64) -> WorkerSnapshot {
    w.machine.snapshot(
        now,
        QueueView::of(&w.parts.queue),
        PreemptionView::of(&w.parts.preempt, now),
        w.parts.pool_usage(),
    )
}

//! The local driver: the component cores owned in one struct, each port call answered at
//! once. The simulator, the benches and the tests run the pass through it.

use super::ports::{op, AdmitOutcome, Ports, QueueIngest, RetainOp, StepReply};
use super::{PassInputs, WorkerParams};
use crate::ids::RequestId;
use crate::policy::admission::{AdmissionQueue, Popped, QueueFacts};
use crate::policy::preemption::{GenPreemption, PreemptParams, StepView};
use crate::pools::{AdmitBudget, DrafterArena, KvPool, PoolUsage, RecurrentPool, SlotPool};

/// Every component core of one worker.
#[derive(Debug, Clone)]
pub struct LocalPorts {
    pub queue: AdmissionQueue,
    pub preempt: GenPreemption,
    pub slots: SlotPool,
    pub kv: KvPool,
    pub recurrent: Option<RecurrentPool>,
    pub drafter: Option<DrafterArena>,
}

impl LocalPorts {
    /// The cores a worker of `params` starts with.
    pub fn new(params: &WorkerParams) -> Self {
        let cap = params.residents_capacity();
        let mut preempt_params = PreemptParams::new(params.mode, params.max_active);
        preempt_params.victim_key = params.victim_key;
        preempt_params.g0 = params.g0;
        preempt_params.gain_from = params.gain_from;
        preempt_params.limits = params.pause_limits;
        Self {
            queue: AdmissionQueue::new(params.admission),
            preempt: GenPreemption::new(preempt_params),
            slots: crate::pools::slot_pool(cap, params.headroom),
            kv: KvPool::new(params.kv),
            recurrent: params
                .recurrent_state_bytes
                .map(|b| RecurrentPool::new(cap, params.headroom, b)),
            drafter: params
                .drafter_window
                .map(|w| DrafterArena::new(cap, params.max_batch_size, w, params.headroom)),
        }
    }

    pub fn pool_usage(&self) -> Vec<PoolUsage> {
        let mut v = vec![self.slots.usage()];
        v.extend(self.kv.usage());
        v.extend(self.recurrent.as_ref().map(|p| p.usage()));
        v.extend(self.drafter.as_ref().map(|p| p.usage()));
        v
    }
}

impl Ports for LocalPorts {
    async fn queue_ingest(
        &mut self,
        q: QueueIngest<'_>,
        rejected: &mut Vec<RequestId>,
        cancelled: &mut Vec<RequestId>,
    ) -> QueueFacts {
        op::queue_ingest(&mut self.queue, q, rejected, cancelled)
    }

    async fn drafter_push(&mut self, inp: &PassInputs) {
        if let Some(d) = self.drafter.as_mut() {
            op::drafter_push(d, inp.stepped_with_ids().map(|(s, ids)| (s.id, ids)));
        }
    }

    async fn release(&mut self, ids: &[RequestId]) -> AdmitBudget {
        AdmitBudget {
            slots: op::release_index(&mut self.slots, ids),
            kv: op::release_kv(&mut self.kv, ids),
            recurrent: self.recurrent.as_mut().map(|p| op::release_index(p, ids)),
            drafter: self.drafter.as_mut().map(|d| op::release_drafter(d, ids)),
        }
    }

    async fn step(&mut self, view: StepView<'_>) -> StepReply {
        op::step(&mut self.preempt, &view)
    }

    async fn pop_admissible(
        &mut self,
        max: u32,
        mut budget: AdmitBudget,
        into: &mut Vec<Popped>,
    ) -> usize {
        self.queue
            .pop_admissible(max, |w| budget.try_take(w.context_tokens), into);
        self.queue.len()
    }

    async fn admit(&mut self, popped: &[Popped], into: &mut Vec<AdmitOutcome>) {
        into.clear();
        into.resize(
            popped.len(),
            AdmitOutcome {
                others: true,
                ..AdmitOutcome::default()
            },
        );
        op::admit_slots(&mut self.slots, popped, into);
        op::admit_kv(&mut self.kv, popped, into);
        if let Some(p) = self.recurrent.as_mut() {
            op::admit_other(|id| p.acquire(id), popped, into);
        }
        if let Some(d) = self.drafter.as_mut() {
            op::admit_other(|id| d.acquire(id), popped, into);
        }
    }

    async fn abandon(&mut self, ids: &[RequestId]) {
        for &id in ids {
            let _ = self.slots.release(id);
            let _ = self.kv.release(id);
            if let Some(p) = self.recurrent.as_mut() {
                let _ = p.release(id);
            }
            if let Some(d) = self.drafter.as_mut() {
                let _ = d.release(id);
            }
        }
    }

    async fn kv_grow(&mut self, rows: &[(RequestId, u32)], into: &mut Vec<Option<u32>>) {
        op::kv_grow(&mut self.kv, rows, into);
    }

    async fn observe_ttft(&mut self, ttfts: &[f64]) {
        for &t in ttfts {
            self.queue.observe_ttft(t);
        }
    }

    async fn drafter_retention(&mut self, ops: &[RetainOp]) {
        if let Some(d) = self.drafter.as_mut() {
            op::drafter_retention(d, ops);
        }
    }
}

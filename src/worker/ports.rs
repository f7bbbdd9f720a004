//! The components as the pass sees them (SPEC §5): one port call per component per phase,
//! each over a whole batch, never per waiter or per resident. The pass (`pass.rs`) is
//! written once against [`Ports`]; [`LocalPorts`](super::LocalPorts) answers from cores it
//! owns (the simulator, the benches), the actor runtime's driver answers by messages to
//! one actor per component. What a component does for each call is written once too, in
//! [`op`], which both drivers call.

use serde::Serialize;

use super::inputs::{Arrival, PassInputs};
use crate::ids::RequestId;
use crate::policy::admission::{AdmissionQueue, Popped, QueueError, QueueFacts, Waiter};
use crate::policy::preemption::{GenPreemption, PreemptDecision, StepView};
use crate::pools::{AdmitBudget, DrafterArena, IndexPool, KvPool};

/// The queue's part of ingest, and the refresh that follows it.
#[derive(Debug, Clone, Copy)]
pub struct QueueIngest<'a> {
    pub arrivals: &'a [Arrival],
    /// Duration of the last step.
    pub step_s: Option<f64>,
    /// Observed admit → KV-ready times, as (context tokens, seconds).
    pub transfers: &'a [(u32, f64)],
    pub cancellations: &'a [RequestId],
    /// The pass's clock and D as of the previous pass, for the refresh.
    pub now: f64,
    pub d: Option<f64>,
}

/// What the controller's step gives back: its decision and what the pass keeps of its state.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepReply {
    pub decision: PreemptDecision,
    /// D after this step (the next pass's refresh uses it).
    pub d: Option<f64>,
    /// Paused requests after this step.
    pub paused: usize,
}

/// One pool's answer to an admission, per waiter in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AdmitOutcome {
    pub slot: Option<u32>,
    /// KV pages the context took.
    pub kv_pages: Option<u32>,
    /// The recurrent-state pool and the drafter arena (where present) gave a lease.
    pub others: bool,
}

impl AdmitOutcome {
    pub fn lease(&self) -> Option<(u32, u32)> {
        match (self.slot, self.kv_pages, self.others) {
            (Some(s), Some(p), true) => Some((s, p)),
            _ => None,
        }
    }
}

/// A drafter retention change, applied in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RetainOp {
    Retain(RequestId),
    Unretain(RequestId),
}

/// The components of a worker, batch by batch. A driver's calls may wait (messages) or be
/// ready at once (owned cores); the pass is the same either way.
// The pass runs on one thread (the caller's, or the executor's arbiter), so the futures
// need no `Send` bound.
#[allow(async_fn_in_trait)]
pub trait Ports {
    /// Queue: enqueue arrivals (refused ones into `rejected`), record the step time and
    /// the transfers, remove cancelled waiters (into `cancelled`, in input order), then
    /// refresh for `now`.
    async fn queue_ingest(
        &mut self,
        q: QueueIngest<'_>,
        rejected: &mut Vec<RequestId>,
        cancelled: &mut Vec<RequestId>,
    ) -> QueueFacts;
    /// Drafter: the step's tokens into each request's window.
    async fn drafter_push(&mut self, inp: &PassInputs);
    /// Every pool: release the leases of `ids`; the room left for admissions.
    async fn release(&mut self, ids: &[RequestId]) -> AdmitBudget;
    /// Controller: track → resume → pause.
    async fn step(&mut self, view: StepView<'_>) -> StepReply;
    /// Queue: the admission phase ([`AdmissionQueue::pop_admissible`]); the queue length.
    async fn pop_admissible(
        &mut self,
        max: u32,
        budget: AdmitBudget,
        into: &mut Vec<Popped>,
    ) -> usize;
    /// Every pool: leases for the popped waiters, one outcome per waiter.
    async fn admit(&mut self, popped: &[Popped], into: &mut Vec<AdmitOutcome>);
    /// Every pool: drop whatever leases `ids` hold (an admission some pool refused).
    async fn abandon(&mut self, ids: &[RequestId]);
    /// KV: grow each (id, tokens) in order; its page count, or `None` when no page was free.
    async fn kv_grow(&mut self, rows: &[(RequestId, u32)], into: &mut Vec<Option<u32>>);
    /// Queue: TTFTs of requests that waited for a slot.
    async fn observe_ttft(&mut self, ttfts: &[f64]);
    /// Drafter: retention changes, in order.
    async fn drafter_retention(&mut self, ops: &[RetainOp]);
}

/// What each component does for a port call: one function per (component, call), shared
/// by the local driver and the component actors.
pub mod op {
    use super::*;

    pub fn queue_ingest(
        queue: &mut AdmissionQueue,
        q: QueueIngest<'_>,
        rejected: &mut Vec<RequestId>,
        cancelled: &mut Vec<RequestId>,
    ) -> QueueFacts {
        for a in q.arrivals {
            let w = Waiter {
                id: a.id,
                arrival: a.arrival,
                context_tokens: a.context_tokens,
                max_tokens: a.max_tokens,
            };
            match queue.push(w) {
                Ok(()) => {}
                Err(QueueError::Full { .. }) | Err(QueueError::Duplicate(_)) => rejected.push(a.id),
            }
        }
        if let Some(s) = q.step_s {
            queue.observe_step(s);
        }
        for &(tokens, s) in q.transfers {
            queue.observe_transfer(tokens, s);
        }
        for &id in q.cancellations {
            if queue.cancel(id) {
                cancelled.push(id);
            }
        }
        queue.refresh(q.now, q.d);
        queue.facts()
    }

    pub fn step(preempt: &mut GenPreemption, view: &StepView<'_>) -> StepReply {
        let decision = preempt.step(view);
        StepReply {
            decision,
            d: preempt.d(),
            paused: preempt.paused_count(),
        }
    }

    /// Pools release every lease exactly once: a failure means a pool and the resident
    /// table disagree.
    pub fn release_index(pool: &mut IndexPool, ids: &[RequestId]) -> u32 {
        for &id in ids {
            let r = pool.release(id);
            debug_assert!(r.is_ok(), "lease release failed: {r:?}");
        }
        pool.available()
    }

    pub fn release_kv(kv: &mut KvPool, ids: &[RequestId]) -> crate::pools::KvBudget {
        for &id in ids {
            let r = kv.release(id);
            debug_assert!(r.is_ok(), "lease release failed: {r:?}");
        }
        kv.budget()
    }

    pub fn release_drafter(d: &mut DrafterArena, ids: &[RequestId]) -> u32 {
        for &id in ids {
            let r = d.release(id);
            debug_assert!(r.is_ok(), "lease release failed: {r:?}");
        }
        d.available()
    }

    pub fn admit_slots(pool: &mut IndexPool, popped: &[Popped], into: &mut [AdmitOutcome]) {
        for (p, o) in popped.iter().zip(into) {
            o.slot = pool.acquire(p.waiter.id).ok();
        }
    }

    pub fn admit_kv(kv: &mut KvPool, popped: &[Popped], into: &mut [AdmitOutcome]) {
        for (p, o) in popped.iter().zip(into) {
            let w = p.waiter;
            o.kv_pages = kv
                .admit(w.id, w.context_tokens)
                .ok()
                .map(|(_, pages)| pages);
        }
    }

    /// A pool that only gives one entry per request (recurrent state, drafter slot).
    pub fn admit_other<E>(
        mut acquire: impl FnMut(RequestId) -> Result<u32, E>,
        popped: &[Popped],
        into: &mut [AdmitOutcome],
    ) {
        for (p, o) in popped.iter().zip(into) {
            o.others &= acquire(p.waiter.id).is_ok();
        }
    }

    pub fn kv_grow(kv: &mut KvPool, rows: &[(RequestId, u32)], into: &mut Vec<Option<u32>>) {
        into.clear();
        into.extend(
            rows.iter()
                .map(|&(id, tokens)| kv.grow_pages(id, tokens).ok()),
        );
    }

    /// The step's tokens, as (id, tokens) rows, into each request's window.
    pub fn drafter_push<'a>(
        d: &mut DrafterArena,
        rows: impl IntoIterator<Item = (RequestId, &'a [u32])>,
    ) {
        // A drafter lease is held exactly while the request is resident; rows of requests
        // that left are refused by the arena and ignored.
        for (id, tokens) in rows {
            if !tokens.is_empty() {
                let _ = d.push_tokens(id, tokens);
            }
        }
    }

    pub fn drafter_retention(d: &mut DrafterArena, ops: &[RetainOp]) {
        for op in ops {
            match *op {
                RetainOp::Retain(id) => {
                    let _ = d.retain(id);
                }
                RetainOp::Unretain(id) => d.unretain(id),
            }
        }
    }
}

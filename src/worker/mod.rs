//! The GEN worker's state machine: one `pass` turns the inputs the leader broadcasts into
//! every decision of that pass (SPEC §4.1). It composes the pure pieces — admission queue,
//! preemption controller, pools, batch builder — in the SPEC's order:
//! ingest → track/resume/pause → admit → build batch.
//! The simulator drives it in virtual time; the actor runtime exchanges the same steps as
//! messages. No clock, no I/O, no randomness.

mod inputs;
pub mod sizing;
mod snapshot;
mod table;

pub use inputs::{
    Admitted, Arrival, BatchRow, Decisions, FirstToken, KvReady, PassInputs, PassOutput, Stepped,
};
pub use snapshot::{ResidentView, WorkerSnapshot};

use serde::Serialize;

use crate::policy::admission::{AdmissionParams, AdmissionQueue, QueueError, Waiter};
use crate::policy::batch::{self, BatchLimits, Candidate};
use crate::policy::preemption::victim::VictimKey;
use crate::policy::preemption::{Departure, GenPreemption, Mode, PreemptParams, Resident};
use crate::policy::RequestId;
use crate::pools::{DrafterArena, KvConfig, KvPool, PoolUsage, RecurrentPool, SlotPool};

/// Everything a worker is sized and configured with (resolved from the config and the
/// setup decision: `headroom` is 0 when preemption is off).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerParams {
    pub max_batch_size: u32,
    pub max_active: u32,
    pub max_num_tokens: u32,
    /// Tokens a request gains per decode step (1 + accepted draft tokens, rounded).
    pub tokens_per_step: u32,
    #[serde(skip)]
    pub admission: AdmissionParams,
    pub mode: Mode,
    pub victim_key: VictimKey,
    pub headroom: u32,
    pub kv: KvConfig,
    /// Recurrent-state bytes per request, for hybrid models.
    pub recurrent_state_bytes: Option<u64>,
    /// Drafter rolling-window tokens, for speculative decoding.
    pub drafter_window: Option<u32>,
}

impl WorkerParams {
    /// A worker with a KV pool of `kv_tokens` tokens and no recurrent or drafter state.
    pub fn simple(max_batch_size: u32, mode: Mode, headroom: u32, kv_tokens: u64) -> Self {
        let tpb = 32;
        Self {
            max_batch_size,
            max_active: max_batch_size,
            max_num_tokens: 8192,
            tokens_per_step: 1,
            admission: AdmissionParams::default(),
            mode,
            victim_key: VictimKey::default(),
            headroom,
            kv: KvConfig {
                tokens_per_block: tpb,
                total_pages: (kv_tokens / tpb as u64).min(u32::MAX as u64) as u32,
                index_rows: max_batch_size + headroom,
                sliding_window: None,
                headroom_rows: headroom,
            },
            recurrent_state_bytes: None,
            drafter_window: None,
        }
    }

    pub fn residents_capacity(&self) -> u32 {
        self.max_active + self.headroom
    }
}

#[derive(Debug, Clone, Serialize)]
struct Res {
    id: RequestId,
    arrival: f64,
    admit_time: f64,
    context_tokens: u32,
    max_tokens: u32,
    waited: bool,
    kv_ready: Option<f64>,
    first_token_time: Option<f64>,
    output_tokens: u32,
    decode_iters: u32,
    slot: u32,
    /// Paused by the preemption controller (mirrors its decisions, checked by the invariants).
    paused: bool,
    /// Tokens its KV pages hold (pages × tokens_per_block): the pool is asked only to grow.
    kv_capacity: u32,
}

impl Res {
    fn view(&self) -> Resident {
        Resident {
            id: self.id,
            arrival: self.arrival,
            admit_time: self.admit_time,
            first_token_time: self.first_token_time,
            output_tokens: self.output_tokens,
            decode_iters: self.decode_iters,
            max_tokens: self.max_tokens,
        }
    }

    /// Tokens in the KV cache before this step (the last host token is the step's input).
    fn cached_tokens(&self) -> u32 {
        self.context_tokens + self.output_tokens.saturating_sub(1)
    }
}

/// Cumulative counts, for metrics and the end-of-run summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WorkerTotals {
    pub arrivals: u64,
    pub rejected: u64,
    pub admitted: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub displaced: u64,
    pub kv_waits: u64,
}

#[derive(Debug, Clone)]
pub struct WorkerCore {
    params: WorkerParams,
    queue: AdmissionQueue,
    preempt: GenPreemption,
    slots: SlotPool,
    kv: KvPool,
    recurrent: Option<RecurrentPool>,
    drafter: Option<DrafterArena>,
    residents: table::ResidentTable,
    /// The batch of the last pass as (id, slot): step results usually come back in this order.
    batch_rows: Vec<(RequestId, u32)>,
    /// Requests left out of the last batch by its limits (they keep all state).
    displaced: Vec<RequestId>,
    /// Buffers reused every pass, so a pass allocates little.
    view_buf: Vec<Resident>,
    cand_buf: Vec<Candidate>,
    /// Batch candidates of the second and third priority class, before they join `cand_buf`.
    cand_forced: Vec<Candidate>,
    cand_rest: Vec<Candidate>,
    forced_buf: Vec<RequestId>,
    finished_buf: Vec<RequestId>,
    leaving_buf: Vec<RequestId>,
    plan_buf: batch::BatchPlan,
    displaced_buf: Vec<RequestId>,
    pass_no: u64,
    totals: WorkerTotals,
    last_batch: usize,
}

impl WorkerCore {
    pub fn new(params: WorkerParams) -> Self {
        let cap = params.residents_capacity();
        let mut preempt_params = PreemptParams::new(params.mode, params.max_active);
        preempt_params.victim_key = params.victim_key;
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
            residents: table::ResidentTable::default(),
            batch_rows: Vec::new(),
            displaced: Vec::new(),
            view_buf: Vec::new(),
            cand_buf: Vec::new(),
            cand_forced: Vec::new(),
            cand_rest: Vec::new(),
            forced_buf: Vec::new(),
            finished_buf: Vec::new(),
            leaving_buf: Vec::new(),
            plan_buf: batch::BatchPlan::default(),
            displaced_buf: Vec::new(),
            pass_no: 0,
            totals: WorkerTotals::default(),
            last_batch: 0,
            params,
        }
    }

    pub fn params(&self) -> &WorkerParams {
        &self.params
    }
    pub fn queue(&self) -> &AdmissionQueue {
        &self.queue
    }
    pub fn preemption(&self) -> &GenPreemption {
        &self.preempt
    }
    pub fn preemption_mut(&mut self) -> &mut GenPreemption {
        &mut self.preempt
    }
    pub fn totals(&self) -> WorkerTotals {
        self.totals
    }
    pub fn resident_count(&self) -> usize {
        self.residents.len()
    }
    pub fn is_resident(&self, id: RequestId) -> bool {
        self.residents.contains_key(&id)
    }
    /// KV pages of a resident request (its page table).
    pub fn pages_of(&self, id: RequestId) -> Option<&[u32]> {
        self.kv.pages_of(id)
    }
    pub fn drafter(&self) -> Option<&DrafterArena> {
        self.drafter.as_ref()
    }
    /// Nothing queued and nothing resident.
    pub fn is_idle(&self) -> bool {
        self.residents.is_empty() && self.queue.is_empty()
    }

    pub fn pool_usage(&self) -> Vec<PoolUsage> {
        let mut v = vec![self.slots.usage()];
        v.extend(self.kv.usage());
        v.extend(self.recurrent.as_ref().map(|p| p.usage()));
        v.extend(self.drafter.as_ref().map(|p| p.usage()));
        v
    }

    fn release_all(&mut self, id: RequestId) {
        // Every lease is released exactly once: each release is checked and a failure
        // would mean a pool and the resident table disagree.
        let results = [
            self.slots.release(id).map(|_| ()),
            self.kv.release(id),
            self.recurrent
                .as_mut()
                .map_or(Ok(()), |p| p.release(id).map(|_| ())),
            self.drafter
                .as_mut()
                .map_or(Ok(()), |p| p.release(id).map(|_| ())),
        ];
        for r in results {
            debug_assert!(r.is_ok(), "lease release failed: {r:?}");
        }
        self.displaced.retain(|x| *x != id);
    }

    fn can_admit(&self, w: &Waiter) -> bool {
        self.slots.available() > 0
            && self.kv.can_admit(w.context_tokens)
            && self.recurrent.as_ref().is_none_or(|p| p.available() > 0)
            && self.drafter.as_ref().is_none_or(|p| p.available() > 0)
    }

    fn acquire_all(&mut self, id: RequestId, context_tokens: u32) -> Option<u32> {
        let slot = self.slots.acquire(id).ok()?;
        let ok = self.kv.admit(id, context_tokens).is_ok()
            && self
                .recurrent
                .as_mut()
                .is_none_or(|p| p.acquire(id).is_ok())
            && self.drafter.as_mut().is_none_or(|p| p.acquire(id).is_ok());
        if ok {
            Some(slot)
        } else {
            // can_admit said yes; undo whatever was taken so nothing leaks.
            let _ = self.slots.release(id);
            let _ = self.kv.release(id);
            if let Some(p) = self.recurrent.as_mut() {
                let _ = p.release(id);
            }
            if let Some(p) = self.drafter.as_mut() {
                let _ = p.release(id);
            }
            None
        }
    }

    /// One scheduling pass.
    pub fn pass(&mut self, inp: &PassInputs) -> PassOutput {
        let mut out = PassOutput::default();
        self.pass_into(inp, &mut out);
        out
    }

    /// One scheduling pass into `out`, every field overwritten: a caller that keeps `out`
    /// across passes reuses its buffers, and the pass then allocates next to nothing.
    pub fn pass_into(&mut self, inp: &PassInputs, out: &mut PassOutput) {
        let now = inp.now;
        self.pass_no += 1;
        out.reset(now, self.pass_no);

        // Ingest: arrivals, step results, KV arrivals, cancellations.
        for a in &inp.arrivals {
            self.totals.arrivals += 1;
            let w = Waiter {
                id: a.id,
                arrival: a.arrival,
                context_tokens: a.context_tokens,
                max_tokens: a.max_tokens,
            };
            match self.queue.push(w) {
                Ok(()) => {}
                Err(QueueError::Full { .. }) | Err(QueueError::Duplicate(_)) => {
                    self.totals.rejected += 1;
                    out.rejected.push(a.id);
                }
            }
        }
        if let Some(s) = inp.step_s {
            self.queue.observe_step(s);
        }
        // Finished and leaving ids, sorted and deduplicated once (reused buffers).
        let mut finished = std::mem::take(&mut self.finished_buf);
        finished.clear();
        for (i, st) in inp.stepped.iter().enumerate() {
            let by_slot = self
                .batch_rows
                .get(i)
                .filter(|(id, _)| *id == st.id)
                .map(|&(_, s)| s);
            let r = match by_slot {
                Some(slot) => self.residents.by_slot_mut(slot, st.id),
                None => self.residents.get_mut(&st.id),
            };
            if let Some(r) = r {
                r.output_tokens = (r.output_tokens + st.tokens).min(r.max_tokens);
                r.decode_iters += 1;
                if let (Some(d), false) = (self.drafter.as_mut(), st.token_ids.is_empty()) {
                    let _ = d.push_tokens(st.id, &st.token_ids);
                }
                if st.stop || r.output_tokens >= r.max_tokens {
                    finished.push(st.id);
                }
            }
        }
        for k in &inp.kv_ready {
            if let Some(r) = self.residents.get_mut(&k.id) {
                if r.kv_ready.is_none() {
                    r.kv_ready = Some(k.at);
                    self.queue
                        .observe_transfer(r.context_tokens, (k.at - r.admit_time).max(0.0));
                }
            }
        }
        finished.sort_unstable();
        finished.dedup();
        let mut leaving = std::mem::take(&mut self.leaving_buf);
        leaving.clear();
        leaving.extend_from_slice(&finished);
        for &id in &inp.cancellations {
            if self.queue.cancel(id) {
                self.totals.cancelled += 1;
                out.cancelled.push(id);
            } else if self.residents.contains_key(&id) && finished.binary_search(&id).is_err() {
                leaving.push(id);
            }
        }
        leaving.sort_unstable();
        leaving.dedup();
        let departed = &mut out.departed;
        for &id in &leaving {
            if let Some(r) = self.residents.remove(&id) {
                let completed = finished.binary_search(&id).is_ok();
                if completed {
                    self.totals.completed += 1;
                } else {
                    self.totals.cancelled += 1;
                    out.cancelled.push(id);
                }
                departed.push(Departure {
                    id,
                    completed,
                    first_token_time: r.first_token_time,
                    finish_time: now,
                    output_tokens: r.output_tokens,
                });
                self.release_all(id);
            }
        }
        self.finished_buf = finished;
        self.leaving_buf = leaving;

        // Track, resume, pause. W₀ uses D as of the previous pass.
        self.queue.refresh(now, self.preempt.d());
        self.view_buf.clear();
        self.view_buf.extend(self.residents.values().map(Res::view));
        let dec = self.preempt.step(&crate::policy::preemption::StepView {
            now,
            residents: &self.view_buf,
            by_admission: Some(self.residents.admission_order()),
            departed: &out.departed,
            queue: &self.queue,
        });
        for id in &dec.pauses {
            if let Some(r) = self.residents.get_mut(id) {
                r.paused = true;
            }
        }
        for id in dec.resumes.iter().chain(&dec.forced_resumes) {
            if let Some(r) = self.residents.get_mut(id) {
                r.paused = false;
            }
        }
        if let Some(d) = self.drafter.as_mut() {
            for id in &dec.pauses {
                let _ = d.retain(*id);
            }
            for id in dec.resumes.iter().chain(&dec.forced_resumes) {
                d.unretain(*id);
            }
        }

        // Admit: paused requests already took their slots; the rest go to the queue.
        let mut free = self.params.max_active.saturating_sub(dec.admission_count);
        while free > 0 {
            let Some(head) = self.queue.peek() else { break };
            if !self.can_admit(&head) {
                break; // head-of-line: the next waiter waits for pool room, in order
            }
            let Some(p) = self.queue.pop() else { break };
            let w = p.waiter;
            let Some(slot) = self.acquire_all(w.id, w.context_tokens) else {
                // Should not happen after can_admit; the request fails rather than leaks.
                out.rejected.push(w.id);
                continue;
            };
            self.residents.insert(Res {
                id: w.id,
                arrival: w.arrival,
                admit_time: now,
                context_tokens: w.context_tokens,
                max_tokens: w.max_tokens,
                waited: p.waited,
                kv_ready: None,
                first_token_time: None,
                output_tokens: 0,
                decode_iters: 0,
                slot,
                paused: false,
                kv_capacity: self.kv.pages_of(w.id).map_or(0, |p| p.len() as u32)
                    * self.params.kv.tokens_per_block,
            });
            self.totals.admitted += 1;
            out.admitted.push(Admitted {
                id: w.id,
                slot,
                context_tokens: w.context_tokens,
                max_tokens: w.max_tokens,
            });
            free -= 1;
        }
        if !self.queue.is_empty() {
            self.queue.mark_left_behind();
        }

        // Build the batch. Walking the residents oldest admission first and splitting them
        // by priority class yields the batch order already (first tokens, then forced
        // resumes, then the rest, each oldest admission first), so nothing is sorted.
        self.forced_buf.clear();
        self.forced_buf.extend_from_slice(&dec.forced_resumes);
        self.forced_buf.sort_unstable();
        self.cand_buf.clear();
        self.cand_forced.clear();
        self.cand_rest.clear();
        for r in self.residents.by_admission() {
            if r.kv_ready.is_none() || r.paused {
                continue;
            }
            let c = Candidate {
                id: r.id,
                slot: r.slot,
                admit_time: r.admit_time,
                first_token_pending: r.first_token_time.is_none(),
                forced_resume: !self.forced_buf.is_empty()
                    && self.forced_buf.binary_search(&r.id).is_ok(),
            };
            if c.first_token_pending {
                self.cand_buf.push(c);
            } else if c.forced_resume {
                self.cand_forced.push(c);
            } else {
                self.cand_rest.push(c);
            }
        }
        self.cand_buf.extend_from_slice(&self.cand_forced);
        self.cand_buf.extend_from_slice(&self.cand_rest);
        let limits = BatchLimits {
            max_batch_size: self.params.max_batch_size,
            max_num_tokens: self.params.max_num_tokens,
            tokens_per_request: self.params.tokens_per_step,
        };
        let plan = &mut self.plan_buf;
        batch::build_sorted_into(&self.cand_buf, &limits, plan);
        self.batch_rows.clear();
        out.batch.reserve(plan.scheduled.len());
        for (&id, &slot) in plan.scheduled.iter().zip(&plan.scheduled_slots) {
            let Some(r) = self.residents.by_slot_mut(slot, id) else {
                continue;
            };
            let first = r.first_token_time.is_none();
            let out_after = if first { 1 } else { r.output_tokens };
            let need = r.context_tokens + out_after + self.params.tokens_per_step - 1;
            if need > r.kv_capacity {
                if self.kv.grow(id, need).is_err() {
                    self.totals.kv_waits += 1;
                    out.kv_waiting.push(id);
                    continue;
                }
                r.kv_capacity = self.kv.pages_of(id).map_or(0, |p| p.len() as u32)
                    * self.params.kv.tokens_per_block;
            }
            if first {
                r.first_token_time = Some(now);
                r.output_tokens = 1;
                let ttft = now - r.arrival;
                if r.waited {
                    self.queue.observe_ttft(ttft);
                }
                out.first_tokens.push(FirstToken {
                    id,
                    ttft,
                    waited: r.waited,
                });
            }
            self.batch_rows.push((id, r.slot));
            out.batch.push(BatchRow {
                id,
                slot: r.slot,
                context_len: r.cached_tokens(),
                first_token: first,
            });
        }
        let now_displaced = &mut self.displaced_buf;
        now_displaced.clear();
        now_displaced.extend(plan.displaced.iter().chain(&plan.token_limited));
        if let Some(d) = self.drafter.as_mut() {
            now_displaced.sort_unstable();
            for id in &self.displaced {
                if now_displaced.binary_search(id).is_err() && !self.preempt.is_paused(*id) {
                    d.unretain(*id);
                }
            }
            for id in now_displaced.iter() {
                let _ = d.retain(*id);
            }
        }
        self.totals.displaced += plan.displaced.len() as u64;
        std::mem::swap(&mut self.displaced, &mut self.displaced_buf);
        self.last_batch = out.batch.len();

        out.displaced.extend_from_slice(&self.plan_buf.displaced);
        out.token_limited
            .extend_from_slice(&self.plan_buf.token_limited);
        out.pauses = dec.pauses;
        out.resumes = dec.resumes;
        out.forced_resumes = dec.forced_resumes;
        out.admission_count = dec.admission_count;
        out.window = dec.window;
        out.queue_len = self.queue.len();
        out.paused = self.preempt.paused_count();
    }

    /// Invariants every pass must keep (checked by property tests).
    pub fn check_invariants(&self, last: &PassOutput) -> Result<(), String> {
        let n = self.residents.len() as u32;
        if last.batch.len() as u32 > self.params.max_batch_size {
            return Err(format!("batch {} > max_batch_size", last.batch.len()));
        }
        if let Some(id) = last.batch.iter().find(|r| self.preempt.is_paused(r.id)) {
            return Err(format!("paused request {} is in the batch", id.id));
        }
        if self.preempt.paused_count() as u32 > self.preempt.paused_cap() {
            return Err("paused count over the cap".into());
        }
        if n > self.params.residents_capacity() {
            return Err(format!(
                "{n} residents > capacity {}",
                self.params.residents_capacity()
            ));
        }
        if self.slots.used() != n || self.kv.used_rows() != n {
            return Err(format!(
                "pool accounting: {n} residents, {} slots, {} kv rows",
                self.slots.used(),
                self.kv.used_rows()
            ));
        }
        if self.recurrent.as_ref().is_some_and(|p| p.used() != n)
            || self.drafter.as_ref().is_some_and(|p| p.used() != n)
        {
            return Err("recurrent/drafter accounting".into());
        }
        if let Some(id) = self
            .preempt
            .paused_ids()
            .find(|id| !self.residents.contains_key(id))
        {
            return Err(format!("paused request {id} is not resident"));
        }
        if let Some(r) = self
            .residents
            .values()
            .find(|r| r.paused != self.preempt.is_paused(r.id))
        {
            return Err(format!(
                "request {}: the table's paused flag disagrees with the controller",
                r.id
            ));
        }
        self.kv.check_invariants()?;
        if let Some(d) = &self.drafter {
            d.check_invariants()?;
            for id in self.preempt.paused_ids() {
                if !d.is_retained(id) {
                    return Err(format!("paused request {id} lost its drafter retention"));
                }
            }
        }
        Ok(())
    }

    /// The state of every component, for `/debug/actors` and the simulator's traces.
    pub fn snapshot(&self, now: f64) -> WorkerSnapshot {
        snapshot::build(self, now)
    }
}

#[cfg(test)]
mod tests;

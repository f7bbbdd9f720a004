//! The admission queue (SPEC §4.2): the TTFT-percentile queue with its target X, the s2f
//! estimate, slack tiers, pop orders and the at-risk queries the preemption controller asks.
//!
//! Cost: every operation is O(log n) in waiters (amortised). A waiter's slack is
//! `X − (now − arrival + s2f)`, which splits into a part common to all waiters,
//! `C = X − now − mean_step`, and a per-waiter key `arrival − transfer(context)`:
//! slack = C + key. Waiters are indexed by key once; tiers are key ranges that slide as C
//! changes, and a waiter crosses each tier boundary about once.

mod order;
mod tiers;

pub use order::{next, AdmissionPolicy, Offers};
pub use tiers::TierCounts;

use std::collections::BTreeMap;

use serde::Serialize;

use super::stats::{RunningMean, WindowPercentile};
use super::transfer::{TransferEstimator, TransferLine};
use crate::ids::RequestId;
use tiers::TierIndex;

/// Re-key the queue after this many transfer observations (keys use a frozen line).
const REKEY_EVERY: u64 = 64;
/// The guard window W₀ as a fraction of D.
pub const GUARD_FRACTION_OF_D: f64 = 0.15;

/// Parameters of the queue (`scheduler_config.gen_admission`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionParams {
    pub policy: AdmissionPolicy,
    pub ttft_percentile: f64,
    pub target_window: usize,
    pub min_samples: usize,
    pub max_waiting: usize,
    /// An operator-set X in seconds instead of the percentile of waited TTFTs. Not part of
    /// SPEC §4.2 and not in the YAML config: the simulator's `--fixed-target` sets it, to
    /// study the queue with an anchored X. It still forms at `min_samples` waited TTFTs.
    pub fixed_target: Option<f64>,
}

impl Default for AdmissionParams {
    fn default() -> Self {
        Self {
            policy: AdmissionPolicy::Auto,
            ttft_percentile: 90.0,
            target_window: 1000,
            min_samples: 200,
            max_waiting: 4096,
            fixed_target: None,
        }
    }
}

/// A request waiting for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Waiter {
    pub id: RequestId,
    /// Arrival in the serving system, on the leader's clock (seconds).
    pub arrival: f64,
    pub context_tokens: u32,
    pub max_tokens: u32,
}

/// A popped waiter, with whether it had to wait for a slot (its TTFT then feeds X).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Popped {
    pub waiter: Waiter,
    pub waited: bool,
}

/// The tier of a waiter at the current refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Late by at least the guard window W₀ (slack ≤ −W₀).
    Overdue,
    /// Late (slack < 0) but not overdue.
    Late,
    Guard,
    OnTime,
    /// X is not formed (or the policy never forms it): no tiers, FIFO.
    NoTarget,
}

/// The waiter the queue would pop next.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Head {
    pub id: RequestId,
    pub tier: Tier,
    /// `None` while X is not formed.
    pub slack: Option<f64>,
}

/// What the preemption controller reads of the queue, taken after `refresh`: data, so the
/// controller needs no reference to the queue (and an actor can send it in a reply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct QueueFacts {
    /// X is formed.
    pub target_formed: bool,
    /// The head's slack (`None` when the queue is empty or X is not formed).
    pub head_slack: Option<f64>,
    /// The head's context and `max_tokens`, the tokens it may hold (with its slack).
    pub head_tokens: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    #[error("waiting queue is full ({max_waiting} requests)")]
    Full { max_waiting: usize },
    #[error("request {0} is already queued")]
    Duplicate(RequestId),
}

#[derive(Debug, Clone)]
struct Entry {
    waiter: Waiter,
    key: f64,
}

/// The admission queue. Feed it observations, `refresh(now, d)` once per pass, then ask.
#[derive(Debug, Clone)]
pub struct AdmissionQueue {
    params: AdmissionParams,
    target: WindowPercentile,
    transfer: TransferEstimator,
    line: TransferLine,
    since_rekey: u64,
    step: RunningMean,
    entries: BTreeMap<u64, Entry>,
    by_id: BTreeMap<RequestId, u64>,
    index: TierIndex,
    next_seq: u64,
    /// Waiters with a sequence number up to this were left behind by an admission phase.
    waited_upto: Option<u64>,
    /// `C = X − now − mean_step` at the last refresh (None: no target).
    common: Option<f64>,
    guard_window: f64,
}

impl AdmissionQueue {
    pub fn new(params: AdmissionParams) -> Self {
        Self {
            params,
            target: WindowPercentile::new(params.ttft_percentile, params.target_window),
            transfer: TransferEstimator::default(),
            line: TransferLine::default(),
            since_rekey: 0,
            step: RunningMean::new(256),
            entries: BTreeMap::new(),
            by_id: BTreeMap::new(),
            index: TierIndex::default(),
            next_seq: 0,
            waited_upto: None,
            common: None,
            guard_window: 0.0,
        }
    }

    pub fn params(&self) -> &AdmissionParams {
        &self.params
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.by_id.contains_key(&id)
    }

    /// X, once formed. The fcfs policy never forms it.
    pub fn target(&self) -> Option<f64> {
        if self.params.policy == AdmissionPolicy::Fcfs
            || self.target.len() < self.params.min_samples
        {
            None
        } else {
            self.params.fixed_target.or_else(|| self.target.value())
        }
    }

    pub fn target_formed(&self) -> bool {
        self.target().is_some()
    }

    /// TTFT samples collected towards X.
    pub fn target_samples(&self) -> usize {
        self.target.len()
    }

    /// Mean decode step time the s2f estimate uses.
    pub fn mean_step(&self) -> f64 {
        self.step.mean().unwrap_or(0.0)
    }

    /// The transfer line s2f uses now, and how many admit → KV-ready times it has seen.
    pub fn transfer_estimate(&self) -> (TransferLine, u64) {
        (self.transfer.line(), self.transfer.samples())
    }

    /// Estimated admission → first token for a context of this length.
    pub fn s2f(&self, context_tokens: u32) -> f64 {
        self.transfer.line().at(context_tokens) + self.mean_step()
    }

    /// Enqueue. Past `max_waiting` the request is refused and nothing queued is touched.
    pub fn push(&mut self, w: Waiter) -> Result<(), QueueError> {
        if self.by_id.contains_key(&w.id) {
            return Err(QueueError::Duplicate(w.id));
        }
        if self.entries.len() >= self.params.max_waiting {
            return Err(QueueError::Full {
                max_waiting: self.params.max_waiting,
            });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = w.arrival - self.line.at(w.context_tokens);
        self.index.insert(seq, w.arrival, key);
        self.entries.insert(seq, Entry { waiter: w, key });
        self.by_id.insert(w.id, seq);
        Ok(())
    }

    /// Remove a waiter (cancelled). Returns whether it was queued.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        match self.by_id.remove(&id) {
            Some(seq) => {
                if let Some(e) = self.entries.remove(&seq) {
                    self.index.remove(seq, e.waiter.arrival, e.key);
                }
                true
            }
            None => false,
        }
    }

    /// A TTFT of a request that had to wait for a slot.
    pub fn observe_ttft(&mut self, ttft: f64) {
        if self.params.policy != AdmissionPolicy::Fcfs {
            self.target.push(ttft);
        }
    }

    /// An observed admit → KV-ready time.
    pub fn observe_transfer(&mut self, context_tokens: u32, seconds: f64) {
        self.transfer.observe(context_tokens, seconds);
        self.since_rekey += 1;
    }

    /// An observed decode step time.
    pub fn observe_step(&mut self, seconds: f64) {
        self.step.push(seconds);
    }

    fn thresholds(&self) -> Option<tiers::Thresholds> {
        self.common.map(|c| tiers::Thresholds {
            late_below: -c,
            on_time_from: self.guard_window - c,
            overdue_upto: -self.guard_window - c,
        })
    }

    /// Re-evaluate slack for the pass at `now`, with D the running mean decode time.
    pub fn refresh(&mut self, now: f64, d: Option<f64>) {
        if self.since_rekey >= REKEY_EVERY {
            self.since_rekey = 0;
            let line = self.transfer.line();
            if line != self.line {
                self.line = line;
                self.rekey();
            }
        }
        self.guard_window = GUARD_FRACTION_OF_D * d.unwrap_or(0.0);
        // The s2f's step part is common to all waiters, so it joins C.
        self.common = self
            .target()
            .map(|x| x - now - self.mean_step())
            .filter(|c| c.is_finite());
        let entries = &self.entries;
        self.index.retier(self.thresholds(), |seq| {
            entries.get(&seq).map(|e| e.waiter.arrival)
        });
    }

    fn rekey(&mut self) {
        self.index = TierIndex::default();
        for (seq, e) in self.entries.iter_mut() {
            e.key = e.waiter.arrival - self.line.at(e.waiter.context_tokens);
            self.index.insert(*seq, e.waiter.arrival, e.key);
        }
    }

    fn slack_of(&self, key: f64) -> Option<f64> {
        self.common.map(|c| c + key)
    }

    fn tier_of_slack(&self, slack: Option<f64>) -> Tier {
        match slack {
            None => Tier::NoTarget,
            Some(s) if s < 0.0 && s <= -self.guard_window => Tier::Overdue,
            Some(s) if s < 0.0 => Tier::Late,
            Some(s) if s < self.guard_window => Tier::Guard,
            Some(_) => Tier::OnTime,
        }
    }

    fn head_seq(&self) -> Option<u64> {
        let offers = self.index.offers(self.thresholds());
        next(self.params.policy, self.common.is_some(), &offers)
    }

    /// The entry of the waiter the queue would pop next.
    fn head_entry(&self) -> Option<&Entry> {
        self.head_seq().and_then(|seq| self.entries.get(&seq))
    }

    /// The waiter the queue would pop next.
    pub fn head(&self) -> Option<Head> {
        let e = self.head_entry()?;
        let slack = self.slack_of(e.key);
        Some(Head {
            id: e.waiter.id,
            tier: self.tier_of_slack(slack),
            slack,
        })
    }

    /// The controller's view of the queue as of the last `refresh`.
    pub fn facts(&self) -> QueueFacts {
        // Without C every slack is None, so the head need not be found.
        let head = self.common.and_then(|_| self.head_entry());
        QueueFacts {
            target_formed: self.target_formed(),
            head_slack: head.and_then(|e| self.slack_of(e.key)),
            head_tokens: head
                .map(|e| u64::from(e.waiter.context_tokens) + u64::from(e.waiter.max_tokens)),
        }
    }

    /// How many waiters have slack below `w` (0 without a target). O(answer · log n).
    pub fn at_risk_count(&self, w: f64) -> usize {
        match self.common {
            None => 0,
            Some(c) => self.index.count_keys_below(w - c),
        }
    }

    /// Waiters per tier at the last refresh (all zero without a target).
    pub fn tier_counts(&self) -> TierCounts {
        self.index.tier_counts()
    }

    /// Pop the head.
    pub fn pop(&mut self) -> Option<Popped> {
        let seq = self.head_seq()?;
        let e = self.entries.remove(&seq)?;
        self.by_id.remove(&e.waiter.id);
        self.index.remove(seq, e.waiter.arrival, e.key);
        let waited = self.waited_upto.is_some_and(|upto| seq <= upto);
        Some(Popped {
            waiter: e.waiter,
            waited,
        })
    }

    /// The head without popping it (the caller checks it fits before popping).
    pub fn peek(&self) -> Option<Waiter> {
        self.head_seq()
            .and_then(|s| self.entries.get(&s))
            .map(|e| e.waiter)
    }

    /// The admission phase: pop up to `max` waiters in queue order while `take_room` admits
    /// each head (it answers whether the head fits in every pool, taking its share when it
    /// does), stopping at the first head that does not fit, so the next waiter waits for pool
    /// room in order (head-of-line). Everyone left queued then had to wait for a slot. The
    /// pools' room is the caller's: the queue only asks.
    pub fn pop_admissible(
        &mut self,
        max: u32,
        mut take_room: impl FnMut(&Waiter) -> bool,
        into: &mut Vec<Popped>,
    ) {
        for _ in 0..max {
            let Some(head) = self.peek() else { break };
            if !take_room(&head) {
                break;
            }
            let Some(p) = self.pop() else { break };
            into.push(p);
        }
        if !self.is_empty() {
            self.mark_left_behind();
        }
    }

    /// Called after an admission phase: everyone still queued had to wait for a slot.
    pub fn mark_left_behind(&mut self) {
        if let Some((&last, _)) = self.entries.last_key_value() {
            self.waited_upto = Some(last);
        }
    }

    /// Waiters in arrival order (for the debug endpoint; O(n)).
    pub fn waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.entries.values().map(|e| &e.waiter)
    }
}

#[cfg(test)]
mod tests;

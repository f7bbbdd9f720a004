//! What replay engines hand to their caller, and the caller-driven interface they share.

use std::cmp::Ordering;

use super::error::ReplayError;
use super::prefix::PrefixHashes;

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    /// Unique per engine, increasing in the order the engine scheduled issues.
    pub id: u64,
    /// Closed loop: the lane that owns the request. Open loop: `None`.
    pub lane: Option<usize>,
    /// Closed loop: index of the session in the engine's session list. Open loop: index of
    /// the request in the trace.
    pub session: usize,
    /// Closed loop: which replay of a session tree this belongs to (unique per engine).
    /// Open loop: 0.
    pub instance: u64,
    /// Sub-agent depth (0 = the root session).
    pub depth: u32,
    pub input_tokens: u32,
    /// Recorded output length (at least 1), to be sent as `max_tokens` with `ignore_eos`.
    pub max_tokens: u32,
    /// Prefix-block ids. Closed loop: scoped to the tree instance (shared by the root and its
    /// sub-agents, distinct across instances, so concurrent replays of one trace do not share
    /// cache). Open loop: as recorded. Compact; `to_vec()` expands them.
    pub hash_ids: PrefixHashes,
    /// Tokens per hash block (0 when there are no hashes).
    pub block_size: u32,
    /// A warm-up turn (primes the cache before the lane's random start point); callers
    /// exclude it from measurements.
    pub warmup: bool,
    /// When it is due, in the caller's time base (seconds).
    pub send_at: f64,
}

/// A caller-driven replay engine. Time is whatever the caller passes as `now` (virtual
/// seconds in the simulator, wall seconds in the load generator); engines never read a clock.
pub trait Replay {
    /// Schedules the first issues relative to `now`.
    fn start(&mut self, now: f64);
    /// Earliest pending send time, if any issue is pending.
    fn next_due(&self) -> Option<f64>;
    /// Removes and returns every pending issue with `send_at <= now`, in `(send_at, id)` order.
    fn pop_due(&mut self, now: f64) -> Vec<Issue>;
    /// Reports that issue `id` finished at `now`; schedules what that unblocks.
    fn on_complete(&mut self, id: u64, now: f64) -> Result<(), ReplayError>;
    /// Issues popped and not yet completed.
    fn in_flight(&self) -> usize;
    /// True when nothing is pending or in flight and nothing more will be scheduled.
    fn is_finished(&self) -> bool;
}

/// Heap entry ordering pending issues by `(send_at, id)`, earliest first.
#[derive(Debug, Clone)]
pub(crate) struct Pending(pub Issue);

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    // Reversed so that `BinaryHeap` (a max-heap) pops the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .0
            .send_at
            .total_cmp(&self.0.send_at)
            .then(other.0.id.cmp(&self.0.id))
    }
}

/// Pops every heap entry due at `now`.
pub(crate) fn drain_due(heap: &mut std::collections::BinaryHeap<Pending>, now: f64) -> Vec<Issue> {
    let mut out = Vec::new();
    while heap.peek().is_some_and(|p| p.0.send_at <= now) {
        if let Some(p) = heap.pop() {
            out.push(p.0);
        }
    }
    out
}

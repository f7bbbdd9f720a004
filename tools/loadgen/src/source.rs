//! Where requests come from: a caller-driven schedule of [`Job`]s.
//!
//! A [`Source`] is a pure state machine over the run's clock (seconds since the run started),
//! the same shape as `genslot::workload`'s replay engines, so the runner can drive closed-loop
//! lanes (the next turn is due only after a completion) and open-loop timestamps alike.

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: u64,
    /// Closed-loop lane; `None` for open-loop traffic.
    pub lane: Option<usize>,
    /// Trace session (closed loop) or trace row (open loop).
    pub session: Option<usize>,
    /// Closed loop: which replay of a session tree the request belongs to.
    pub conversation: Option<u64>,
    pub input_tokens: u32,
    /// Recorded output length; sent as `max_tokens` with `ignore_eos`.
    pub max_tokens: u32,
    pub hash_ids: Vec<u64>,
    pub block_size: u32,
    /// Separates independent replays of the same trace (cache busting).
    pub prefix_salt: u64,
    /// Sent to prime caches; excluded from the summary.
    pub warmup: bool,
    /// When the source wants it sent (run seconds).
    pub send_at: f64,
}

/// A request schedule driven by the caller's clock.
pub trait Source: Send {
    /// Schedules the first requests.
    fn start(&mut self, now: f64);
    /// Earliest pending send time; `None` when nothing is pending (all lanes waiting on
    /// completions, or the trace is exhausted).
    fn next_due(&self) -> Option<f64>;
    /// Removes and returns every job with `send_at <= now`, in send order.
    fn pop_due(&mut self, now: f64) -> Vec<Job>;
    /// Reports that job `id` finished (successfully or not) at `now`.
    fn on_complete(&mut self, id: u64, now: f64);
    /// True for open-loop sources, whose arrivals do not wait on completions.
    fn open_loop(&self) -> bool;
    /// Arrivals the source dropped instead of sending (a capped open loop).
    fn skipped_arrivals(&self) -> u64 {
        0
    }
}

/// Closed-loop lanes of identical requests with a fixed end-to-start gap: the simplest
/// schedule that still obeys the closed-loop rule. Useful for smoke tests of a server.
#[derive(Debug, Clone)]
pub struct FixedLanes {
    pub concurrency: usize,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Gap between a lane's completion and its next send.
    pub gap_s: f64,
    /// Flag each lane's first request as warm-up.
    pub warmup_first: bool,
    next_id: u64,
    /// Per lane: `Some(send_at)` when a send is pending.
    pending: Vec<Option<f64>>,
    sent: Vec<u32>,
    in_flight: std::collections::BTreeMap<u64, usize>,
}

impl FixedLanes {
    pub fn new(
        concurrency: usize,
        input_tokens: u32,
        output_tokens: u32,
        gap_s: f64,
        warmup_first: bool,
    ) -> Self {
        Self {
            concurrency,
            input_tokens,
            output_tokens,
            gap_s,
            warmup_first,
            next_id: 0,
            pending: vec![None; concurrency],
            sent: vec![0; concurrency],
            in_flight: Default::default(),
        }
    }
}

impl Source for FixedLanes {
    fn start(&mut self, now: f64) {
        self.pending.iter_mut().for_each(|p| *p = Some(now));
    }

    fn next_due(&self) -> Option<f64> {
        self.pending.iter().flatten().copied().reduce(f64::min)
    }

    fn pop_due(&mut self, now: f64) -> Vec<Job> {
        let mut due: Vec<(f64, usize)> = Vec::new();
        for (lane, p) in self.pending.iter_mut().enumerate() {
            if let Some(t) = *p {
                if t <= now {
                    due.push((t, lane));
                    *p = None;
                }
            }
        }
        due.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        due.into_iter()
            .map(|(send_at, lane)| {
                let id = self.next_id;
                self.next_id += 1;
                self.in_flight.insert(id, lane);
                let warmup = self.warmup_first && self.sent[lane] == 0;
                self.sent[lane] += 1;
                Job {
                    id,
                    lane: Some(lane),
                    session: Some(lane),
                    conversation: Some(lane as u64),
                    input_tokens: self.input_tokens,
                    max_tokens: self.output_tokens,
                    hash_ids: Vec::new(),
                    block_size: 64,
                    prefix_salt: lane as u64,
                    warmup,
                    send_at,
                }
            })
            .collect()
    }

    fn on_complete(&mut self, id: u64, now: f64) {
        if let Some(lane) = self.in_flight.remove(&id) {
            self.pending[lane] = Some(now + self.gap_s);
        }
    }

    fn open_loop(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_lane_is_due_again_only_a_gap_after_its_completion() {
        let mut s = FixedLanes::new(2, 10, 5, 0.5, true);
        s.start(0.0);
        let first = s.pop_due(0.0);
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|j| j.warmup));
        assert_eq!(s.next_due(), None, "both lanes wait on completions");
        s.on_complete(first[0].id, 3.0);
        assert_eq!(s.next_due(), Some(3.5));
        assert!(s.pop_due(3.4).is_empty());
        let again = s.pop_due(3.5);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].lane, first[0].lane);
        assert!(!again[0].warmup);
    }
}

//! Open-loop replay of timed traces (Mooncake, Azure): requests are due at their recorded
//! arrival, relative to the first one, divided by a rate scale (`scale = 2.0` sends at twice
//! the recorded rate), optionally capped in count and in (scaled) duration.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::error::ReplayError;
use super::issue::{Issue, Replay};
use super::prefix::PrefixHashes;
use super::types::TimedRequest;

/// Open-loop settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenLoopRules {
    /// Rate multiplier (> 0).
    pub scale: f64,
    /// Send at most this many requests.
    pub max_requests: Option<usize>,
    /// Send only requests due within this many seconds of the start.
    pub max_duration_s: Option<f64>,
}

impl Default for OpenLoopRules {
    fn default() -> Self {
        Self {
            scale: 1.0,
            max_requests: None,
            max_duration_s: None,
        }
    }
}

/// Open-loop replay engine; completions only matter for `in_flight`/`is_finished`.
#[derive(Debug)]
pub struct OpenLoopReplay {
    requests: Arc<[TimedRequest]>,
    rules: OpenLoopRules,
    /// Request indices in send order (arrival, then file order), capped.
    order: Vec<usize>,
    cursor: usize,
    t0: f64,
    start: f64,
    in_flight: BTreeSet<u64>,
}

impl OpenLoopReplay {
    pub fn new(requests: Arc<[TimedRequest]>, rules: OpenLoopRules) -> Result<Self, ReplayError> {
        if !(rules.scale.is_finite() && rules.scale > 0.0) {
            return Err(ReplayError::Rules(format!(
                "scale {} must be > 0",
                rules.scale
            )));
        }
        if rules.max_duration_s.is_some_and(|d| d.is_nan() || d < 0.0) {
            return Err(ReplayError::Rules("max_duration_s must be >= 0".into()));
        }
        if requests.is_empty() {
            return Err(ReplayError::NoSessions);
        }
        Ok(Self {
            requests,
            rules,
            order: Vec::new(),
            cursor: 0,
            t0: 0.0,
            start: 0.0,
            in_flight: BTreeSet::new(),
        })
    }
}

impl OpenLoopReplay {
    fn send_at(&self, i: usize) -> f64 {
        self.start + (self.requests[i].t - self.t0) / self.rules.scale
    }

    /// Number of requests the run will send (after the caps); known after `start`.
    pub fn planned(&self) -> usize {
        self.order.len()
    }
}

impl Replay for OpenLoopReplay {
    /// Schedules the whole (capped) trace; requests are sorted by arrival, ties by file order.
    fn start(&mut self, now: f64) {
        let mut order: Vec<usize> = (0..self.requests.len()).collect();
        order.sort_by(|&a, &b| self.requests[a].t.total_cmp(&self.requests[b].t));
        self.t0 = self.requests[order[0]].t;
        self.start = now;
        order.truncate(self.rules.max_requests.unwrap_or(usize::MAX));
        if let Some(d) = self.rules.max_duration_s {
            let keep = order
                .iter()
                .take_while(|&&i| (self.requests[i].t - self.t0) / self.rules.scale <= d)
                .count();
            order.truncate(keep);
        }
        self.order = order;
        self.cursor = 0;
    }

    fn next_due(&self) -> Option<f64> {
        self.order.get(self.cursor).map(|&i| self.send_at(i))
    }

    fn pop_due(&mut self, now: f64) -> Vec<Issue> {
        let mut due = Vec::new();
        while let Some(&i) = self.order.get(self.cursor) {
            let send_at = self.send_at(i);
            if send_at > now {
                break;
            }
            let r = &self.requests[i];
            let id = self.cursor as u64;
            self.cursor += 1;
            self.in_flight.insert(id);
            due.push(Issue {
                id,
                lane: None,
                session: i,
                instance: 0,
                depth: 0,
                input_tokens: r.input_tokens,
                max_tokens: r.output_tokens.max(1),
                hash_ids: PrefixHashes::recorded(Arc::new(r.hash_ids.clone())),
                block_size: r.block_size,
                warmup: false,
                send_at,
            });
        }
        due
    }

    fn on_complete(&mut self, id: u64, _now: f64) -> Result<(), ReplayError> {
        if self.in_flight.remove(&id) {
            Ok(())
        } else {
            Err(ReplayError::UnknownIssue(id))
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn is_finished(&self) -> bool {
        self.cursor >= self.order.len() && self.in_flight.is_empty()
    }
}

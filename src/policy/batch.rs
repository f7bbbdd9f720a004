//! Batch building (SPEC §4.6): from the active, unpaused requests whose KV has arrived,
//! up to `max_batch_size` requests and `max_num_tokens` tokens. Requests not yet at their
//! first token go first (each first step emits a first token), then requests force-resumed
//! this pass, then the rest oldest admission first. What the size limit leaves out is
//! displaced: it keeps all state and returns from its last host token.
//! The pass builds its batch in one walk over the resident table (`worker::build`), with
//! this module's cut; `build` states the same order over a candidate list, and a property
//! test of the worker (`pass_batch_is_the_policy_batch_order`) checks the two agree.

use std::cmp::Ordering;

use serde::Serialize;

use crate::ids::RequestId;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BatchLimits {
    pub max_batch_size: u32,
    pub max_num_tokens: u32,
    /// Tokens a decode request costs per step (1 + draft tokens).
    pub tokens_per_request: u32,
}

impl BatchLimits {
    /// The cut: how many requests one step takes (every request costs the same tokens, so
    /// this is a count), and whether `max_batch_size` sets it. What the cut leaves out is
    /// displaced when it does and token-limited when `max_num_tokens` does.
    pub fn cut(&self) -> (usize, bool) {
        let by_tokens = (self.max_num_tokens / self.tokens_per_request.max(1)) as usize;
        let by_size = self.max_batch_size as usize;
        (by_size.min(by_tokens), by_tokens >= by_size)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub id: RequestId,
    pub admit_time: f64,
    pub first_token_pending: bool,
    pub forced_resume: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BatchPlan {
    /// Scheduling order.
    pub scheduled: Vec<RequestId>,
    /// Left out by `max_batch_size`.
    pub displaced: Vec<RequestId>,
    /// Left out by `max_num_tokens`.
    pub token_limited: Vec<RequestId>,
}

fn priority(c: &Candidate) -> (u8, f64, RequestId) {
    let class = if c.first_token_pending {
        0
    } else if c.forced_resume {
        1
    } else {
        2
    };
    (class, c.admit_time, c.id)
}

fn by_priority(a: &Candidate, b: &Candidate) -> Ordering {
    let (ca, ta, ia) = priority(a);
    let (cb, tb, ib) = priority(b);
    ca.cmp(&cb).then(ta.total_cmp(&tb)).then(ia.cmp(&ib))
}

/// Order candidates and cut at the limits.
pub fn build(candidates: &mut [Candidate], limits: &BatchLimits) -> BatchPlan {
    candidates.sort_by(by_priority);
    // The plan is a split: the first `k` are scheduled, the rest left out by the limit
    // that set the cut.
    let (limit, size_cut) = limits.cut();
    let k = candidates.len().min(limit);
    let (taken, rest) = candidates.split_at(k);
    let left_out = rest.iter().map(|c| c.id).collect();
    let (displaced, token_limited) = if size_cut {
        (left_out, Vec::new())
    } else {
        (Vec::new(), left_out)
    };
    BatchPlan {
        scheduled: taken.iter().map(|c| c.id).collect(),
        displaced,
        token_limited,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u64, admit: f64) -> Candidate {
        Candidate {
            id,
            admit_time: admit,
            first_token_pending: false,
            forced_resume: false,
        }
    }

    const LIMITS: BatchLimits = BatchLimits {
        max_batch_size: 3,
        max_num_tokens: 8192,
        tokens_per_request: 1,
    };

    #[test]
    fn first_token_requests_go_first() {
        let plan = build(
            &mut [
                c(1, 0.0),
                Candidate {
                    first_token_pending: true,
                    ..c(2, 5.0)
                },
                c(3, 1.0),
            ],
            &LIMITS,
        );
        assert_eq!(plan.scheduled, vec![2, 1, 3]);
    }

    #[test]
    fn forced_resume_at_full_batch_displaces_newest() {
        let forced = Candidate {
            forced_resume: true,
            ..c(9, 0.5)
        };
        let plan = build(&mut [c(1, 0.0), c(2, 1.0), c(3, 2.0), forced], &LIMITS);
        assert_eq!(plan.scheduled, vec![9, 1, 2]);
        assert_eq!(plan.displaced, vec![3]);
    }

    #[test]
    fn batch_never_exceeds_either_limit() {
        let mut many: Vec<_> = (0..10).map(|i| c(i, i as f64)).collect();
        let plan = build(
            &mut many.clone(),
            &BatchLimits {
                max_batch_size: 8,
                max_num_tokens: 10,
                tokens_per_request: 2,
            },
        );
        assert_eq!(plan.scheduled.len(), 5);
        assert_eq!(plan.token_limited.len(), 5);
        let plan = build(
            &mut many,
            &BatchLimits {
                max_batch_size: 4,
                max_num_tokens: 100,
                tokens_per_request: 1,
            },
        );
        assert_eq!(plan.scheduled.len(), 4);
        assert_eq!(plan.displaced.len(), 6);
    }
}

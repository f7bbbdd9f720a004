//! What a pass takes and what it decides. `PassInputs` is what the leader broadcasts: with
//! identical inputs every rank computes an identical `PassOutput`.

use serde::{Deserialize, Serialize};

use crate::ids::RequestId;
use crate::policy::preemption::Departure;

/// A new request for the waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Arrival {
    pub id: RequestId,
    /// Arrival in the serving system, leader clock, seconds.
    pub arrival: f64,
    pub context_tokens: u32,
    pub max_tokens: u32,
}

/// An admitted request's context (KV) arrived at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KvReady {
    pub id: RequestId,
    pub at: f64,
}

/// What the last step produced for one request. Its token ids, when the backend has them,
/// are in [`PassInputs::stepped_ids`]: a row stays 24 bytes with no vector of its own, and
/// the pass reads every row while only the drafter reads ids.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Stepped {
    pub id: RequestId,
    /// Tokens emitted by the step (more than one with speculative decoding).
    pub tokens: u32,
    /// How many of `stepped_ids` are this row's emitted token ids (0 without ids).
    pub ids: u32,
    /// The request stopped (EOS past `min_tokens`); reaching `max_tokens` also stops it.
    pub stop: bool,
}

/// One pass's inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PassInputs {
    /// The leader's clock reading for this pass, seconds.
    pub now: f64,
    pub arrivals: Vec<Arrival>,
    pub cancellations: Vec<RequestId>,
    pub kv_ready: Vec<KvReady>,
    pub stepped: Vec<Stepped>,
    /// The stepped rows' emitted token ids, row after row (`Stepped::ids` of each), when the
    /// backend has them: they feed the drafter window.
    pub stepped_ids: Vec<u32>,
    /// Duration of the last step, seconds.
    pub step_s: Option<f64>,
}

impl PassInputs {
    /// Empties every input of the pass just run, keeping the vectors' capacity for the next
    /// (`now` is set by the caller before each pass).
    pub fn clear(&mut self) {
        self.arrivals.clear();
        self.cancellations.clear();
        self.kv_ready.clear();
        self.stepped.clear();
        self.stepped_ids.clear();
        self.step_s = None;
    }

    /// One step result, with its emitted token ids (empty when the backend has none).
    pub fn push_stepped(&mut self, id: RequestId, tokens: u32, stop: bool, ids: &[u32]) {
        self.stepped.push(Stepped {
            id,
            tokens,
            ids: ids.len() as u32,
            stop,
        });
        self.stepped_ids.extend_from_slice(ids);
    }

    /// Each step result with its token ids.
    pub fn stepped_with_ids(&self) -> impl Iterator<Item = (&Stepped, &[u32])> {
        split_ids(self.stepped.iter().map(|s| (s, s.ids)), &self.stepped_ids)
    }
}

/// Rows that each own the next `n` of `ids`, in order, with their slices (a row whose count
/// runs past the end gets what is there).
pub fn split_ids<T>(
    rows: impl IntoIterator<Item = (T, u32)>,
    ids: &[u32],
) -> impl Iterator<Item = (T, &[u32])> {
    let mut at = 0usize;
    rows.into_iter().map(move |(row, n)| {
        let from = at.min(ids.len());
        at = (at + n as usize).min(ids.len());
        (row, &ids[from..at])
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Admitted {
    pub id: RequestId,
    pub slot: u32,
    pub context_tokens: u32,
    pub max_tokens: u32,
}

/// One row of this pass's decode step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BatchRow {
    pub id: RequestId,
    pub slot: u32,
    /// Tokens already in the KV cache; the last host token is this step's input.
    pub context_len: u32,
    /// This step emits the request's first token.
    pub first_token: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FirstToken {
    pub id: RequestId,
    pub ttft: f64,
    /// It had to wait for a slot (its TTFT feeds X).
    pub waited: bool,
}

/// Every decision of one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct PassOutput {
    pub now: f64,
    pub pass: u64,
    /// Refused at arrival (queue full): HTTP 429.
    pub rejected: Vec<RequestId>,
    /// Cancelled while waiting or resident.
    pub cancelled: Vec<RequestId>,
    /// Admitted this pass: start their KV transfer.
    pub admitted: Vec<Admitted>,
    pub pauses: Vec<RequestId>,
    pub resumes: Vec<RequestId>,
    pub forced_resumes: Vec<RequestId>,
    /// Left out of the batch by `max_batch_size` after forced resumes.
    pub displaced: Vec<RequestId>,
    /// Left out by `max_num_tokens`.
    pub token_limited: Vec<RequestId>,
    /// Left out because decode growth found no free KV page (they wait, nothing is evicted).
    pub kv_waiting: Vec<RequestId>,
    /// Aborted because the last pass stalled: every row waited for a KV page
    /// (`policy::kv_stall`); each left with a departure, and its client gets an error.
    pub kv_aborted: Vec<RequestId>,
    pub batch: Vec<BatchRow>,
    pub first_tokens: Vec<FirstToken>,
    pub departed: Vec<Departure>,
    pub admission_count: u32,
    pub window: f64,
    pub queue_len: usize,
    pub paused: usize,
}

impl PassOutput {
    /// Empty every list (keeping its buffer) and stamp the pass; the rest is set by the pass.
    pub(super) fn reset(&mut self, now: f64, pass: u64) {
        let PassOutput {
            now: n,
            pass: p,
            rejected,
            cancelled,
            admitted,
            pauses,
            resumes,
            forced_resumes,
            displaced,
            token_limited,
            kv_waiting,
            kv_aborted,
            batch,
            first_tokens,
            departed,
            admission_count,
            window,
            queue_len,
            paused,
        } = self;
        *n = now;
        *p = pass;
        rejected.clear();
        cancelled.clear();
        admitted.clear();
        pauses.clear();
        resumes.clear();
        forced_resumes.clear();
        displaced.clear();
        token_limited.clear();
        kv_waiting.clear();
        kv_aborted.clear();
        batch.clear();
        first_tokens.clear();
        departed.clear();
        *admission_count = 0;
        *window = 0.0;
        *queue_len = 0;
        *paused = 0;
    }

    /// The decisions alone (pauses, resumes, forced resumes, admissions, batch), for
    /// comparing runs.
    pub fn decisions(&self) -> Decisions {
        Decisions {
            pauses: self.pauses.clone(),
            resumes: self.resumes.clone(),
            forced_resumes: self.forced_resumes.clone(),
            admitted: self.admitted.iter().map(|a| a.id).collect(),
            batch: self.batch.iter().map(|b| b.id).collect(),
        }
    }
}

/// The decisions of one pass, without timings, for comparing two runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decisions {
    pub pauses: Vec<RequestId>,
    pub resumes: Vec<RequestId>,
    pub forced_resumes: Vec<RequestId>,
    pub admitted: Vec<RequestId>,
    pub batch: Vec<RequestId>,
}

//! The `model` step backend (SPEC §6): no GPU, only time. A decode step takes the timing
//! model's `t(B, ΣL)` and a context arrival the transfer model's time, both from the
//! config's `timing` section (the formulas live in `timing`). In the server the backend
//! sleeps for real; in tests it advances a shared [`VirtualClock`](crate::timing::VirtualClock)
//! instead.
//!
//! Token ids are deterministic: a hash of (request id, position) into the vocabulary, so a
//! rerun of the same requests streams the same text. The first token (the context's, at
//! position 0) is known at arrival; the first step that includes a request returns it too,
//! ahead of the step's own tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{
    Arrived, BackendCapacity, BackendError, ContextArrival, ContextLane, StepBackend, StepOutput,
    StepRow,
};
use crate::config::Config;
use crate::ids::RequestId;
use crate::timing::{Clock, StepModel, TransferModel};

/// Llama 2's vocabulary size, the server tokenizer's default.
pub const DEFAULT_VOCAB: u32 = 32_000;

/// The token at `position` of request `id`: FNV-1a over both, stable across runs.
pub fn token_id(id: RequestId, position: u32, vocab: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.to_le_bytes().into_iter().chain(position.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(vocab.max(1))) as u32
}

/// Context arrivals of the model backend: sleep (or advance) the transfer time. Runs
/// concurrently with steps, as a KV transfer does.
#[derive(Debug, Clone)]
pub struct ModelTransfer {
    transfer: TransferModel,
    clock: Arc<dyn Clock>,
    /// The backend's vocabulary (its steps read it here too).
    vocab: u32,
}

impl ContextLane for ModelTransfer {
    fn context_arrival(&self, req: &ContextArrival) -> Result<Arrived, BackendError> {
        let ctx = u32::try_from(req.prompt.len()).unwrap_or(u32::MAX);
        let s = self.transfer.transfer_s(ctx);
        self.clock.pass(s);
        Ok(Arrived {
            seconds: s,
            first_token: Some(token_id(req.id, 0, self.vocab)),
        })
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Tokens returned so far (the first token included).
    emitted: u32,
    /// Fractional tokens-per-step accumulator (speculative decoding).
    acc: f64,
}

/// The timing-model backend.
#[derive(Debug)]
pub struct ModelBackend {
    step: StepModel,
    lane: ModelTransfer,
    clock: Arc<dyn Clock>,
    capacity: BackendCapacity,
    progress: BTreeMap<RequestId, Progress>,
}

impl ModelBackend {
    pub fn new(
        step: StepModel,
        transfer: TransferModel,
        capacity: BackendCapacity,
        clock: Arc<dyn Clock>,
    ) -> Self {
        ModelBackend {
            step,
            lane: ModelTransfer {
                transfer,
                clock: clock.clone(),
                vocab: DEFAULT_VOCAB,
            },
            clock,
            capacity,
            progress: BTreeMap::new(),
        }
    }

    /// The backend a config describes, on `clock`.
    pub fn from_config(cfg: &Config, clock: Arc<dyn Clock>) -> Self {
        let tpb = cfg.kv_cache_config.tokens_per_block.max(1);
        let capacity = BackendCapacity {
            kv_pages: (cfg.kv_cache_config.max_tokens / u64::from(tpb)).min(u32::MAX as u64) as u32,
            tokens_per_block: tpb,
            seq_slots: cfg.max_num_active_requests().saturating_mul(2),
        };
        Self::new(
            StepModel::from_timing(&cfg.timing),
            TransferModel::from_timing(&cfg.timing),
            capacity,
            clock,
        )
    }

    pub fn with_vocab(mut self, vocab: u32) -> Self {
        self.lane.vocab = vocab.max(1);
        self
    }

    /// Modelled seconds of a step over `rows` (without sleeping).
    pub fn step_seconds(&self, rows: &[StepRow]) -> f64 {
        let kv: u64 = rows.iter().map(|r| u64::from(r.context_len)).sum();
        self.step.step_s(rows.len(), kv)
    }
}

impl StepBackend for ModelBackend {
    fn context_arrival(&mut self, req: &ContextArrival) -> Result<Arrived, BackendError> {
        self.lane.context_arrival(req)
    }

    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError> {
        let mut out = StepOutput::default();
        self.step_into(rows, &mut out)?;
        Ok(out)
    }

    fn step_into(&mut self, rows: &[StepRow], out: &mut StepOutput) -> Result<(), BackendError> {
        let step_s = self.step_seconds(rows);
        let tps = self.step.tokens_per_step;
        let whole_tps = tps.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&tps);
        // The row vectors handed back are refilled, not reallocated.
        out.tokens.resize_with(rows.len(), Vec::new);
        for (row, tokens) in rows.iter().zip(out.tokens.iter_mut()) {
            let p = self.progress.entry(row.id).or_default();
            let mut n = if whole_tps {
                tps as u32 // whole tokens per step: nothing to accumulate
            } else {
                let before = p.acc.floor();
                p.acc += tps;
                (p.acc.floor() - before) as u32
            };
            if p.emitted == 0 {
                n += 1; // the first token comes with the request's first step
            }
            let start = p.emitted;
            p.emitted += n;
            tokens.clear();
            tokens.extend((start..start + n).map(|pos| token_id(row.id, pos, self.lane.vocab)));
        }
        out.step_s = step_s;
        self.clock.pass(step_s);
        Ok(())
    }

    fn release(&mut self, id: RequestId) {
        self.progress.remove(&id);
    }

    fn capacity(&self) -> BackendCapacity {
        self.capacity
    }

    fn context_lane(&self) -> Option<Arc<dyn ContextLane>> {
        Some(Arc::new(self.lane.clone()))
    }

    fn needs_page_tables(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::VirtualClock;

    fn backend(clock: VirtualClock) -> ModelBackend {
        let cfg = Config::default();
        ModelBackend::from_config(&cfg, Arc::new(clock))
    }

    fn row(id: RequestId, context_len: u32) -> StepRow {
        StepRow {
            id,
            slot: 0,
            context_len,
            last_token: 0,
            pages: Vec::new(),
        }
    }

    #[test]
    fn a_step_advances_the_virtual_clock_by_the_timing_model() {
        let clock = VirtualClock::new();
        let mut b = backend(clock.clone());
        let rows = [row(1, 1000), row(2, 3000)];
        let out = b.step(&rows).unwrap();
        let cfg = Config::default();
        let step = StepModel::from_timing(&cfg.timing);
        assert_eq!(out.step_s, step.step_s(2, 4000));
        assert_eq!(clock.now(), out.step_s);
    }

    #[test]
    fn the_first_step_returns_the_first_token_and_later_steps_one_each() {
        let mut b = backend(VirtualClock::new());
        let first = b.step(&[row(7, 10)]).unwrap();
        let second = b.step(&[row(7, 11)]).unwrap();
        assert_eq!(first.tokens[0].len(), 2);
        assert_eq!(second.tokens[0].len(), 1);
        assert_eq!(
            [first.tokens[0].clone(), second.tokens[0].clone()].concat(),
            (0..3)
                .map(|p| token_id(7, p, DEFAULT_VOCAB))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn stepping_into_reused_buffers_gives_the_tokens_of_fresh_steps() {
        let mut fresh = backend(VirtualClock::new());
        let mut reused = backend(VirtualClock::new());
        let mut out = StepOutput {
            // Stale rows of another batch, more of them than this one has.
            tokens: vec![vec![99, 98], vec![97], vec![96]],
            step_s: -1.0,
        };
        for rows in [[row(5, 8), row(6, 9)], [row(6, 10), row(5, 9)]] {
            reused.step_into(&rows, &mut out).unwrap();
            let want = fresh.step(&rows).unwrap();
            assert_eq!(out.tokens, want.tokens);
            assert_eq!(out.step_s, want.step_s);
        }
    }

    #[test]
    fn tokens_are_deterministic_per_request_and_position() {
        let run = || {
            let mut b = backend(VirtualClock::new());
            (0..4)
                .flat_map(|_| b.step(&[row(3, 5), row(9, 5)]).unwrap().tokens)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        assert_ne!(token_id(3, 0, DEFAULT_VOCAB), token_id(9, 0, DEFAULT_VOCAB));
    }

    #[test]
    fn a_released_request_starts_over() {
        let mut b = backend(VirtualClock::new());
        let a = b.step(&[row(4, 1)]).unwrap();
        b.release(4);
        assert_eq!(b.step(&[row(4, 1)]).unwrap().tokens, a.tokens);
    }

    #[test]
    fn context_arrival_takes_the_transfer_time() {
        let clock = VirtualClock::new();
        let b = backend(clock.clone());
        let lane = b.context_lane().unwrap();
        let s = lane
            .context_arrival(&ContextArrival {
                id: 1,
                slot: 0,
                prompt: vec![0; 500],
                pages: Vec::new(),
                sampling: Default::default(),
                min_tokens: 0,
            })
            .unwrap();
        let cfg = Config::default();
        let transfer = TransferModel::from_timing(&cfg.timing);
        assert_eq!(s.seconds, transfer.transfer_s(500));
        assert_eq!(clock.now(), s.seconds);
    }

    #[test]
    fn the_first_token_given_at_arrival_is_the_one_the_first_step_returns_first() {
        let b = backend(VirtualClock::new()).with_vocab(50);
        let arrival = |id| ContextArrival {
            id,
            slot: 0,
            prompt: vec![0; 8],
            pages: Vec::new(),
            sampling: Default::default(),
            min_tokens: 0,
        };
        let lane = b.context_lane().unwrap();
        let mut b = b;
        for id in [1, 2, 77] {
            let given = lane.context_arrival(&arrival(id)).unwrap().first_token;
            let first_step = b.step(&[row(id, 8)]).unwrap();
            assert_eq!(given, first_step.tokens[0].first().copied());
            assert!(given.is_some_and(|t| t < 50));
        }
    }
}

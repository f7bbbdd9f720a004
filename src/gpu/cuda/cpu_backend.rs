//! The f32 CPU reference as a step backend: a real checkpoint served on any CPU (slowly),
//! with the CUDA backend's per-request sampling state (`Residents`) and the host sampler
//! that mirrors the device's. It lets the server path of a real model (tokenizer, chat
//! template, EOS, `min_tokens`, sampling) run and be tested without a GPU. Context arrival is
//! a prefill; page tables are ignored, each request keeps its own contiguous cache, whose
//! length is checked against every step row's `context_len`.
//!
//! With a drafter (`with_drafter`) each computed row is a verify pass: prompt lookup over
//! the request's window in the host arena (laid out as the device's, at the request's
//! sequence slot), the input and k drafts through the model at once, the accepted drafts and
//! one more token emitted, the cache cut back to what was accepted (`draft.rs`). Hybrid
//! shapes keep their recurrent states in each request's cache.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::cpu_ref::{CpuCache, CpuModel};
use super::draft::{self, DraftConfig, DraftStats, HostArena};
use super::residents::Residents;
use crate::gpu::{
    Arrived, BackendCapacity, BackendError, ContextArrival, StepBackend, StepOutput, StepRow,
};
use crate::ids::RequestId;
use crate::pools::drafter::DrafterLayout;
use crate::sampling::sample_row;

pub struct CpuRefBackend {
    model: Arc<CpuModel>,
    eos: Option<u32>,
    capacity: BackendCapacity,
    reqs: Residents,
    caches: HashMap<RequestId, CpuCache>,
    drafter: Option<(DraftConfig, HostArena)>,
    stats: DraftStats,
}

impl CpuRefBackend {
    /// `eos`: the model's end-of-sequence token (banned below a request's `min_tokens`);
    /// `capacity`: what the backend reports to the setup decision.
    pub fn new(model: Arc<CpuModel>, eos: Option<u32>, capacity: BackendCapacity) -> Self {
        CpuRefBackend {
            model,
            eos,
            capacity,
            reqs: Residents::default(),
            caches: HashMap::new(),
            drafter: None,
            stats: DraftStats::default(),
        }
    }

    /// Speculative decoding by prompt lookup: one arena slot per sequence slot
    /// (`capacity.seq_slots`), one scratch row per batch row up to `max_batch`. A hybrid
    /// model is refused: its recurrent state cannot be rolled back past rejected drafts.
    pub fn with_drafter(mut self, cfg: DraftConfig, max_batch: u32) -> Result<Self, BackendError> {
        cfg.validate().map_err(BackendError::Failed)?;
        if self.model.shape.recurrent_layers() > 0 {
            return Err(BackendError::Failed(format!(
                "shape {}: drafting is not supported with recurrent layers (their state \
                 cannot be rolled back past rejected drafts)",
                self.model.shape.name
            )));
        }
        let layout = DrafterLayout::new(self.capacity.seq_slots, max_batch, cfg.window);
        self.drafter = Some((cfg, HostArena::new(layout)));
        Ok(self)
    }

    /// Verify rows computed, tokens they emitted and drafts proposed, since the start.
    pub fn draft_stats(&self) -> DraftStats {
        self.stats
    }

    fn check_tokens(&self, id: RequestId, tokens: &[u32]) -> Result<(), BackendError> {
        let vocab = self.model.shape.vocab;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(BackendError::Failed(format!(
                "request {id}: token {t} outside the vocabulary ({vocab})"
            ))),
            None => Ok(()),
        }
    }

    fn check_slot(&self, req: &ContextArrival) -> Result<(), BackendError> {
        if req.slot >= self.capacity.seq_slots {
            return Err(BackendError::Failed(format!(
                "request {}: sequence slot {} outside the backend's {}",
                req.id, req.slot, self.capacity.seq_slots
            )));
        }
        if let Some(other) = self.reqs.slot_holder(req.slot, req.id) {
            return Err(BackendError::Failed(format!(
                "request {}: sequence slot {} is held by request {other}",
                req.id, req.slot
            )));
        }
        Ok(())
    }
}

impl StepBackend for CpuRefBackend {
    fn context_arrival(&mut self, req: &ContextArrival) -> Result<Arrived, BackendError> {
        let t0 = Instant::now();
        if req.prompt.is_empty() {
            return Err(BackendError::Failed(format!(
                "request {}: empty prompt",
                req.id
            )));
        }
        self.check_tokens(req.id, &req.prompt)?;
        self.check_slot(req)?;
        let mut cache = self.model.new_cache();
        let logits = self.model.forward(&mut cache, &req.prompt);
        let last = logits.last().map(Vec::as_slice).unwrap_or_default();
        let (st, row) = Residents::arriving(req, self.eos);
        let first = sample_row(last, &row);
        if let Some((cfg, arena)) = self.drafter.as_mut() {
            // The window: the prompt's tail, then the first token (the next step's input).
            let slot = arena.slot_mut(req.slot);
            draft::reset(slot);
            let tail = req.prompt.len().saturating_sub(cfg.window as usize);
            draft::push(slot, &req.prompt[tail..]);
            draft::push(slot, &[first]);
        }
        self.reqs.prefilled(req.id, st, first);
        self.caches.insert(req.id, cache);
        Ok(Arrived {
            seconds: t0.elapsed().as_secs_f64(),
            first_token: Some(first),
        })
    }

    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError> {
        let t0 = Instant::now();
        let plan = self.reqs.plan(rows, self.eos)?;
        let mut out: Vec<Vec<u32>> = Vec::with_capacity(plan.run.len());
        let mut drafts = Vec::new();
        for (b, (r, samp)) in plan.run.iter().zip(&plan.samples).enumerate() {
            self.check_tokens(r.id, &[r.last_token])?;
            let st = self
                .reqs
                .get(r.id)
                .ok_or(BackendError::UnknownRequest(r.id))?;
            let cache = self
                .caches
                .get_mut(&r.id)
                .ok_or(BackendError::UnknownRequest(r.id))?;
            if cache.len != r.context_len as usize {
                return Err(BackendError::Failed(format!(
                    "request {}: the step consumes position {}, the cache holds {} tokens",
                    r.id, r.context_len, cache.len
                )));
            }
            drafts.clear();
            if let Some((cfg, arena)) = self.drafter.as_mut() {
                draft::propose(
                    arena.slot(st.slot),
                    cfg.max_ngram,
                    cfg.max_draft_len,
                    &mut drafts,
                );
                // The scratch row of this batch row holds its draft, as on the device.
                let sc = arena.scratch_mut(b as u32);
                sc[0] = drafts.len() as u32;
                sc[1..=drafts.len()].copy_from_slice(&drafts);
            }
            let mut input = Vec::with_capacity(1 + drafts.len());
            input.push(r.last_token);
            input.extend_from_slice(&drafts);
            let logits = self.model.forward(cache, &input);
            // Each position's token is drawn as plain decoding would draw it there; drafts
            // are read while they match the token drawn before them.
            let mut emitted = vec![sample_row(&logits[0], samp)];
            let pos = u64::from(r.context_len) + 1;
            for (i, &d) in drafts.iter().enumerate() {
                if emitted[i] != d {
                    break;
                }
                let row = st.sample_row_ahead(pos, i as u32 + 1, self.eos);
                emitted.push(sample_row(&logits[i + 1], &row));
            }
            if !cache.truncate(r.context_len as usize + emitted.len()) {
                return Err(BackendError::Failed(format!(
                    "request {}: its cache cannot drop rejected drafts",
                    r.id
                )));
            }
            if let Some((_, arena)) = self.drafter.as_mut() {
                draft::push(arena.slot_mut(st.slot), &emitted);
                self.stats.rows += 1;
                self.stats.emitted += emitted.len() as u64;
                self.stats.drafted += drafts.len() as u64;
            }
            out.push(emitted);
        }
        let tokens = self.reqs.finish_rows(plan, out.iter().map(Vec::as_slice))?;
        Ok(StepOutput {
            tokens,
            step_s: t0.elapsed().as_secs_f64(),
        })
    }

    fn release(&mut self, id: RequestId) {
        self.reqs.remove(id);
        self.caches.remove(&id);
    }

    fn capacity(&self) -> BackendCapacity {
        self.capacity
    }

    fn needs_page_tables(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::cuda::shape::ModelShape;
    use crate::sampling::SamplingParams;

    fn backend(eos: Option<u32>) -> CpuRefBackend {
        backend_of("tiny", eos)
    }

    fn backend_of(shape: &str, eos: Option<u32>) -> CpuRefBackend {
        let shape = ModelShape::named(shape).unwrap();
        CpuRefBackend::new(
            Arc::new(CpuModel::seeded(&shape, 3)),
            eos,
            BackendCapacity {
                kv_pages: 64,
                tokens_per_block: 16,
                seq_slots: 8,
            },
        )
    }

    fn arrival(id: u64, sampling: SamplingParams, min_tokens: u32) -> ContextArrival {
        ContextArrival {
            id,
            slot: id as u32 % 8,
            prompt: vec![5, 17, 900, 3],
            pages: Vec::new(),
            sampling,
            min_tokens,
        }
    }

    fn row(id: u64, ctx: u32, last: u32) -> StepRow {
        StepRow {
            id,
            slot: id as u32 % 8,
            context_len: ctx,
            last_token: last,
            pages: Vec::new(),
        }
    }

    /// Runs `n` tokens of request `id` alone, as the executor's rows would come: prompt +
    /// tokens out − 1 cached, the last token out as input (none before the first step).
    fn generate(b: &mut CpuRefBackend, id: u64, n: usize) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        while out.len() < n {
            let ctx = 4 + (out.len() as u32).saturating_sub(1);
            let last = out.last().copied().unwrap_or(0);
            let step = b.step(&[row(id, ctx, last)]).unwrap();
            out.extend(&step.tokens[0]);
        }
        out.truncate(n);
        out
    }

    #[test]
    fn greedy_tokens_are_the_reference_models_argmax_chain() {
        let mut b = backend(None);
        b.context_arrival(&arrival(1, SamplingParams::GREEDY, 0))
            .unwrap();
        let got = generate(&mut b, 1, 5);
        let m = &b.model;
        let mut cache = m.new_cache();
        let mut l = m.forward(&mut cache, &[5, 17, 900, 3]);
        let mut want = Vec::new();
        for _ in 0..5 {
            let t = crate::sampling::argmax(l.last().unwrap());
            want.push(t);
            l = m.forward(&mut cache, &[t]);
        }
        assert_eq!(got, want);
    }

    #[test]
    fn seeded_sampling_repeats_and_min_tokens_keeps_eos_out() {
        let p = SamplingParams {
            temperature: 1.5,
            top_p: 0.95,
            top_k: 0,
            seed: Some(9),
        };
        let run = |min_tokens: u32, eos: Option<u32>| {
            let mut b = backend(eos);
            b.context_arrival(&arrival(7, p, min_tokens)).unwrap();
            generate(&mut b, 7, 6)
        };
        let a = run(0, None);
        assert_eq!(a, run(0, None));
        // Make the first sampled token the EOS: with min_tokens 6 it never appears.
        let masked = run(6, Some(a[0]));
        assert!(!masked.contains(&a[0]), "{masked:?} holds {}", a[0]);
    }

    #[test]
    fn a_row_out_of_step_with_the_cache_is_an_error() {
        let mut b = backend(None);
        b.context_arrival(&arrival(2, SamplingParams::GREEDY, 0))
            .unwrap();
        // The first step emits the prefill's token and decodes from it: 5 tokens cached.
        assert_eq!(b.step(&[row(2, 4, 0)]).unwrap().tokens[0].len(), 2);
        let e = b.step(&[row(2, 9, 1)]).unwrap_err().to_string();
        assert!(e.contains("position 9") && e.contains("holds 5"), "{e}");
        b.release(2);
        assert!(matches!(
            b.step(&[row(2, 4, 1)]),
            Err(BackendError::UnknownRequest(2))
        ));
    }

    #[test]
    fn a_slot_outside_the_backend_or_held_by_another_request_is_refused() {
        let mut b = backend(None);
        b.context_arrival(&arrival(1, SamplingParams::GREEDY, 0))
            .unwrap();
        let mut twin = arrival(9, SamplingParams::GREEDY, 0);
        let e = b.context_arrival(&twin).unwrap_err().to_string();
        assert!(e.contains("slot 1 is held by request 1"), "{e}");
        twin.slot = 8;
        let e = b.context_arrival(&twin).unwrap_err().to_string();
        assert!(e.contains("slot 8 outside"), "{e}");
    }

    #[test]
    fn a_hybrid_model_cannot_draft() {
        let cfg = DraftConfig {
            window: 16,
            max_draft_len: 4,
            max_ngram: 3,
        };
        let e = backend_of("tiny-hybrid", None)
            .with_drafter(cfg, 4)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("recurrent layers"), "{e}");
        assert!(backend(None).with_drafter(cfg, 4).is_ok());
    }
}

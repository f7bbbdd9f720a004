//! The f32 CPU reference as a step backend: a real checkpoint served on any CPU (slowly),
//! with the CUDA backend's per-request sampling state (`Residents`) and the host sampler
//! that mirrors the device's. It lets the server path of a real model (tokenizer, chat
//! template, EOS, `min_tokens`, sampling) run and be tested without a GPU. Context arrival is
//! a prefill; page tables are ignored, each request keeps its own contiguous cache, whose
//! length is checked against every step row's `context_len`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::cpu_ref::{CpuCache, CpuModel};
use super::residents::Residents;
use crate::gpu::{BackendCapacity, BackendError, ContextArrival, StepBackend, StepOutput, StepRow};
use crate::policy::RequestId;
use crate::sampling::sample_row;

pub struct CpuRefBackend {
    model: Arc<CpuModel>,
    eos: Option<u32>,
    capacity: BackendCapacity,
    reqs: Residents,
    caches: HashMap<RequestId, CpuCache>,
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
        }
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
}

impl StepBackend for CpuRefBackend {
    fn context_arrival(&mut self, req: &ContextArrival) -> Result<f64, BackendError> {
        let t0 = Instant::now();
        if req.prompt.is_empty() {
            return Err(BackendError::Failed(format!(
                "request {}: empty prompt",
                req.id
            )));
        }
        self.check_tokens(req.id, &req.prompt)?;
        let mut cache = self.model.new_cache();
        let logits = self.model.forward(&mut cache, &req.prompt);
        let last = logits.last().map(Vec::as_slice).unwrap_or_default();
        let (st, row) = Residents::arriving(req, self.eos);
        self.reqs.prefilled(req.id, st, sample_row(last, &row));
        self.caches.insert(req.id, cache);
        Ok(t0.elapsed().as_secs_f64())
    }

    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError> {
        let t0 = Instant::now();
        let plan = self.reqs.plan(rows, self.eos)?;
        let mut out = Vec::with_capacity(plan.run.len());
        for (r, samp) in plan.run.iter().zip(&plan.samples) {
            self.check_tokens(r.id, &[r.last_token])?;
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
            let logits = self.model.forward(cache, &[r.last_token]);
            let last = logits.last().map(Vec::as_slice).unwrap_or_default();
            out.push(sample_row(last, samp));
        }
        let tokens = self.reqs.finish(rows, plan, &out)?;
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
        let shape = ModelShape::named("tiny").unwrap();
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
            prompt: vec![5, 17, 900, 3],
            pages: Vec::new(),
            sampling,
            min_tokens,
        }
    }

    fn row(id: u64, ctx: u32, last: u32) -> StepRow {
        StepRow {
            id,
            slot: 0,
            context_len: ctx,
            last_token: last,
            pages: Vec::new(),
        }
    }

    /// Runs `n` tokens of request `id` alone, as the executor's rows would come.
    fn generate(b: &mut CpuRefBackend, id: u64, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut last = 0;
        for k in 0..n {
            let ctx = 4 + k.max(1) as u32 - 1;
            last = b.step(&[row(id, ctx, last)]).unwrap().tokens[0][0];
            out.push(last);
        }
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
        b.step(&[row(2, 4, 0)]).unwrap();
        let e = b.step(&[row(2, 9, 1)]).unwrap_err().to_string();
        assert!(e.contains("position 9") && e.contains("holds 4"), "{e}");
        b.release(2);
        assert!(matches!(
            b.step(&[row(2, 4, 1)]),
            Err(BackendError::UnknownRequest(2))
        ));
    }
}

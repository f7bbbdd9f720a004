//! `context: transfer` (SPEC §6): a request's context arrives as a KV transfer stand-in
//! instead of a prefill, as on a disaggregated GEN worker that receives KV from a context
//! server. The request's pages get seeded values (a kernel on the transfer stream, so the
//! writes cost HBM bandwidth beside the decode steps like a real transfer's) and the arrival
//! takes at least bytes ÷ bandwidth, where bytes is the KV of every prompt token. As from a
//! real context server, the first output token comes with the KV (`handed_over_token` stands
//! in for the context server's sample): the executor streams it when the request is first
//! scheduled, and the first decode step decodes from it, as after a prefill. Arrivals run on
//! their own threads (`ContextLane`), so they overlap the decode steps; the step thread picks
//! the arrived requests up at its next step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream};

use super::device::{drv, launch_on, DevBuf, Gpu, Which, A};
use super::forward::KvCache;
use super::residents::ReqState;
use super::shape::ModelShape;
use crate::gpu::{Arrived, BackendError, ContextArrival, ContextLane};
use crate::ids::RequestId;
use crate::sampling::row_key;

/// How a request's context (its prompt's KV) arrives on this worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ContextMode {
    /// A real prefill on the prefill stream: needed for correct text from real weights.
    Prefill,
    /// Seeded KV written at `gbps` GB/s (10⁹ bytes per second), for load experiments.
    Transfer { gbps: f64 },
}

/// Bytes a transfer of a `prompt_tokens`-token context moves: the KV of every prompt token.
pub fn transfer_bytes(prompt_tokens: usize, kv_bytes_per_token: u64) -> u64 {
    prompt_tokens as u64 * kv_bytes_per_token
}

/// The first output token the stand-in's context server hands over with the KV: drawn
/// from the request's sampling seed at the first token's position, so a rerun hands over the
/// same one, and never the model's EOS while `min_tokens` asks for more.
pub fn handed_over_token(req: &ContextArrival, vocab: usize, eos: Option<u32>) -> u32 {
    let vocab = vocab.max(2) as u64;
    let key = row_key(req.sampling.seed_for(req.id), req.prompt.len() as u64);
    let t = (key % vocab) as u32;
    if req.min_tokens > 0 && Some(t) == eos {
        ((u64::from(t) + 1) % vocab) as u32
    } else {
        t
    }
}

/// An arrived request, until the step thread takes it: its sampling state (the first token
/// in it) and its prompt, which seeds a drafter window as after a prefill.
#[derive(Debug)]
pub(crate) struct Landed {
    pub st: ReqState,
    pub prompt: Vec<u32>,
}

/// The least time a transfer of `bytes` takes at `gbps`.
pub fn transfer_time(bytes: u64, gbps: f64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / (gbps * 1e9))
}

/// The arrival side of `context: transfer`, shared by the backend and the arrival threads.
pub(crate) struct TransferLane {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    fill: CudaFunction,
    /// (base pointer, elements per region, elements per page, regions) of the KV cache.
    geometry: (u64, u64, usize, usize),
    num_pages: usize,
    page_size: usize,
    vocab: usize,
    eos: Option<u32>,
    max_context: usize,
    kv_bytes_per_token: u64,
    gbps: f64,
    /// Device page list of the transfer in flight (one at a time on the stream).
    pages: Mutex<DevBuf>,
    /// Arrived, not yet taken by the step thread.
    arrived: Mutex<HashMap<RequestId, Landed>>,
}

// SAFETY: the device buffer is only touched under its mutex, with the context bound to the
// calling thread; the CUDA driver API is thread-safe.
unsafe impl Send for TransferLane {}
unsafe impl Sync for TransferLane {}

impl std::fmt::Debug for TransferLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferLane")
            .field("gbps", &self.gbps)
            .field("kv_bytes_per_token", &self.kv_bytes_per_token)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TransferLane {
    /// `eos`: the model's EOS, never handed over below `min_tokens`.
    pub fn new(
        gpu: &Gpu,
        kv: &KvCache,
        shape: &ModelShape,
        gbps: f64,
        max_context: usize,
        eos: Option<u32>,
    ) -> Result<Self, BackendError> {
        let max_pages = max_context.div_ceil(kv.page_size).max(1);
        Ok(TransferLane {
            ctx: gpu.ctx.clone(),
            stream: gpu.transfer.clone(),
            fill: gpu.k.fill_pages.clone(),
            geometry: kv.geometry(),
            num_pages: kv.num_pages,
            page_size: kv.page_size,
            vocab: shape.vocab,
            eos,
            max_context,
            kv_bytes_per_token: shape.kv_bytes_per_token(),
            gbps,
            pages: Mutex::new(gpu.alloc(max_pages * 4, Which::Transfer)?),
            arrived: Mutex::new(HashMap::new()),
        })
    }

    /// Requests that arrived since the last call.
    pub fn take_arrived(&self) -> Vec<(RequestId, Landed)> {
        let mut a = lock(&self.arrived);
        if a.is_empty() {
            return Vec::new();
        }
        let mut v: Vec<(RequestId, Landed)> = a.drain().collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// Arrived requests not yet taken.
    pub fn pending(&self) -> usize {
        lock(&self.arrived).len()
    }

    /// Drops an arrived request that left before any step took it.
    pub fn forget(&self, id: RequestId) {
        lock(&self.arrived).remove(&id);
    }

    fn check(&self, req: &ContextArrival) -> Result<(), BackendError> {
        let id = req.id;
        let n = req.prompt.len();
        let last = *req
            .prompt
            .last()
            .ok_or_else(|| BackendError::Failed(format!("request {id}: empty prompt")))?;
        if last as usize >= self.vocab {
            return Err(BackendError::Failed(format!(
                "request {id}: token {last} outside the vocabulary ({})",
                self.vocab
            )));
        }
        if n > self.max_context {
            return Err(BackendError::Failed(format!(
                "request {id}: {n} tokens exceed max_context {}",
                self.max_context
            )));
        }
        let need = n.div_ceil(self.page_size);
        if req.pages.len() < need {
            return Err(BackendError::Failed(format!(
                "request {id}: {} pages cannot hold {n} tokens ({need} needed)",
                req.pages.len()
            )));
        }
        if let Some(p) = req.pages[..need]
            .iter()
            .find(|&&p| p as usize >= self.num_pages)
        {
            return Err(BackendError::Failed(format!(
                "request {id}: page {p} is outside the KV cache ({} pages)",
                self.num_pages
            )));
        }
        Ok(())
    }

    /// Writes the pages holding the prompt's KV, on the transfer stream.
    fn write_pages(&self, req: &ContextArrival) -> Result<(), BackendError> {
        let n = req.prompt.len().div_ceil(self.page_size);
        if n == 0 {
            return Ok(());
        }
        let ids: Vec<i32> = req.pages[..n].iter().map(|&p| p as i32).collect();
        let (base, region_elems, page_elems, regions) = self.geometry;
        let buf = lock(&self.pages);
        self.ctx
            .bind_to_thread()
            .map_err(drv("bind context (transfer)"))?;
        // SAFETY: the buffer holds max_context / page_size ids and n is at most that; the
        // copy is staged from pageable memory before the call returns.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(buf.ptr, &ids, self.stream.cu_stream())
        }
        .map_err(drv("page list copy"))?;
        launch_on(
            &self.stream,
            &self.fill,
            (n as u32, regions as u32, 1),
            256,
            0,
            &[
                A::P(base),
                A::P(buf.ptr),
                A::L(region_elems),
                A::I(page_elems as i32),
                A::U(req.id as u32 ^ 0x7a11),
            ],
            false,
        )?;
        self.stream
            .synchronize()
            .map_err(drv("transfer stream synchronize"))
    }
}

impl ContextLane for TransferLane {
    fn context_arrival(&self, req: &ContextArrival) -> Result<Arrived, BackendError> {
        let t0 = Instant::now();
        self.check(req)?;
        self.write_pages(req)?;
        let want = transfer_time(
            transfer_bytes(req.prompt.len(), self.kv_bytes_per_token),
            self.gbps,
        );
        if let Some(rest) = want.checked_sub(t0.elapsed()) {
            std::thread::sleep(rest);
        }
        let first = handed_over_token(req, self.vocab, self.eos);
        let landed = Landed {
            st: ReqState::new(req).with_first_token(first),
            prompt: req.prompt.clone(),
        };
        lock(&self.arrived).insert(req.id, landed);
        Ok(Arrived {
            seconds: t0.elapsed().as_secs_f64(),
            first_token: Some(first),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_moves_the_kv_of_every_prompt_token() {
        let s = ModelShape::named("llama-8b").unwrap();
        // 32 layers x 8 kv heads x 128 dims x (K, V) x 2 bytes = 128 KiB per token.
        assert_eq!(s.kv_bytes_per_token(), 131_072);
        assert_eq!(transfer_bytes(4096, s.kv_bytes_per_token()), 4096 * 131_072);
        assert_eq!(transfer_bytes(1, 131_072), 131_072);
        assert_eq!(transfer_bytes(0, 131_072), 0);
    }

    fn arrival(id: u64, prompt_len: usize, min_tokens: u32, seed: Option<u64>) -> ContextArrival {
        ContextArrival {
            id,
            slot: 0,
            prompt: vec![7; prompt_len],
            pages: Vec::new(),
            sampling: crate::sampling::SamplingParams {
                seed,
                ..crate::sampling::SamplingParams::GREEDY
            },
            min_tokens,
        }
    }

    #[test]
    fn the_handed_over_token_repeats_with_the_seed_and_stays_in_the_vocabulary() {
        let a = arrival(5, 100, 0, Some(11));
        let t = handed_over_token(&a, 1000, None);
        assert!(t < 1000);
        assert_eq!(handed_over_token(&a, 1000, None), t, "rerun");
        // Another request with the same seed and prompt length gets the same token; other
        // seeds spread over the vocabulary.
        assert_eq!(
            handed_over_token(&arrival(6, 100, 0, Some(11)), 1000, None),
            t
        );
        let spread: std::collections::BTreeSet<u32> = (0..64)
            .map(|s| handed_over_token(&arrival(1, 100, 0, Some(s)), 1000, None))
            .collect();
        assert!(spread.len() > 50, "{} distinct of 64", spread.len());
    }

    #[test]
    fn the_eos_is_never_handed_over_while_min_tokens_asks_for_more() {
        let a = arrival(5, 100, 0, Some(11));
        let eos = handed_over_token(&a, 1000, None);
        // Without min_tokens the context server may end the request at once.
        assert_eq!(handed_over_token(&a, 1000, Some(eos)), eos);
        let held = arrival(5, 100, 1, Some(11));
        let t = handed_over_token(&held, 1000, Some(eos));
        assert_ne!(t, eos);
        assert!(t < 1000);
    }

    #[test]
    fn transfer_time_is_bytes_over_bandwidth() {
        // 4096 tokens of llama-8b KV (512 MiB) at 50 GB/s: 10.7 ms.
        let t = transfer_time(4096 * 131_072, 50.0);
        assert!((t.as_secs_f64() - 0.010_737_418_24).abs() < 1e-9, "{t:?}");
        assert_eq!(transfer_time(0, 25.0), Duration::ZERO);
        assert!(transfer_time(1 << 30, 1.0) > transfer_time(1 << 30, 2.0));
    }
}

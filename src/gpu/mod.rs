//! Step backends: the one trait the GPU-step actor and the simulator drive, and its
//! implementations. `model` is the embedded default (a timing model, any CPU); `cuda` is
//! real decode on an NVIDIA GPU through cudarc, probed at run time.

pub mod cuda;
pub mod model;

use std::sync::Arc;

use crate::ids::RequestId;
use crate::sampling::SamplingParams;

/// Why a backend call failed. Backends never panic on a missing GPU.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("request {0} is unknown to the backend")]
    UnknownRequest(RequestId),
    #[error("backend failure: {0}")]
    Failed(String),
}

/// One admitted request whose context (KV) must arrive on this worker.
#[derive(Debug, Clone)]
pub struct ContextArrival {
    pub id: RequestId,
    /// Its sequence slot: a backend keeps the request's recurrent state and drafter window
    /// at this index (the recurrent-state pool and the drafter arena give the same one).
    pub slot: u32,
    /// Prompt token ids (may be synthetic); `len()` is the context length.
    pub prompt: Vec<u32>,
    /// KV pool pages that hold this request's context, in order.
    pub pages: Vec<u32>,
    /// How the backend samples this request's tokens.
    pub sampling: SamplingParams,
    /// The model's EOS is never sampled while fewer tokens than this were produced.
    pub min_tokens: u32,
}

/// A context that is resident on this worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrived {
    /// Seconds the arrival took.
    pub seconds: f64,
    /// The request's first token, when the backend has it before the request's first step
    /// (a prefill draws it, a KV transfer hands it over, the timing model knows it). The
    /// executor streams it when the request is first scheduled (SPEC §4.6) instead of with
    /// that step's tokens. `None`: it comes with the first step (a backend whose first step
    /// computes it; none here does).
    pub first_token: Option<u32>,
}

/// One row of a decode step.
#[derive(Debug, Clone)]
pub struct StepRow {
    pub id: RequestId,
    /// Sequence-slot (batch-row) index owned by this request.
    pub slot: u32,
    /// Tokens already in the KV cache (context + generated so far).
    pub context_len: u32,
    /// The last token on the host: the input of this step.
    pub last_token: u32,
    /// KV pool pages, in order; covers `context_len + 1` tokens.
    pub pages: Vec<u32>,
}

/// What one decode step produced.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Tokens emitted per row, in the order of the batch (more than one with speculation).
    pub tokens: Vec<Vec<u32>>,
    /// Seconds the step took (measured, or modelled).
    pub step_s: f64,
}

/// Capacity a backend reports, used by the setup decision (SPEC §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendCapacity {
    /// KV pages the backend can hold.
    pub kv_pages: u32,
    /// Tokens per KV page.
    pub tokens_per_block: u32,
    /// Sequence slots (batch rows) it can address.
    pub seq_slots: u32,
}

/// The step backend (SPEC §6): context arrival, one decode step, release, capacity.
/// Calls block; the GPU-step actor runs them on its own OS thread.
pub trait StepBackend: Send {
    /// Context arrival for an admitted request (KV transfer or real prefill). The backend
    /// also returns the first token's id as the first of the tokens of the next `step` that
    /// includes the request, whether or not [`Arrived::first_token`] gave it already.
    fn context_arrival(&mut self, req: &ContextArrival) -> Result<Arrived, BackendError>;
    /// One decode step over `rows` (never more than `max_batch_size`).
    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError>;
    /// [`step`](Self::step) into `out`, every field overwritten. The caller hands the same
    /// buffers back step after step, so a backend that fills the token vectors in place
    /// allocates nothing per row; the default replaces them with `step`'s.
    fn step_into(&mut self, rows: &[StepRow], out: &mut StepOutput) -> Result<(), BackendError> {
        *out = self.step(rows)?;
        Ok(())
    }
    /// The request left this worker; drop any per-request state.
    fn release(&mut self, id: RequestId);
    /// What the backend can hold.
    fn capacity(&self) -> BackendCapacity;
    /// Whether `StepRow::pages` must be filled. A backend without device memory says no,
    /// which spares copying every row's page table on every step.
    fn needs_page_tables(&self) -> bool {
        true
    }
    /// A handle that runs context arrivals concurrently with steps (a transfer engine, a
    /// second stream). `None`: they run on the step thread through `context_arrival`.
    fn context_lane(&self) -> Option<Arc<dyn ContextLane>> {
        None
    }
}

/// Context arrivals that run beside the decode steps, from any thread.
pub trait ContextLane: Send + Sync + std::fmt::Debug {
    /// Blocks until the request's context is resident.
    fn context_arrival(&self, req: &ContextArrival) -> Result<Arrived, BackendError>;
}

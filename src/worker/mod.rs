//! The GEN worker's state machine: one pass turns the inputs the leader broadcasts into
//! every decision of that pass (SPEC §4.1). `PassMachine::run` (`pass.rs`) is that pass, in
//! the SPEC's order — ingest → track/resume/pause → admit → build batch — written once
//! against the components' ports (`ports.rs`): `WorkerCore` runs it over cores it owns
//! (`LocalPorts`, the simulator's worker), the actor runtime over one actor per component.
//! No clock, no I/O, no randomness — except in `ranks`, which carries a pass's inputs
//! (`wire`) to the other tensor-parallel ranks and their decision hashes back.

mod build;
mod inputs;
mod local;
mod pass;
pub mod ports;
pub mod ranks;
pub mod sizing;
mod snapshot;
mod table;
pub mod wire;

pub use inputs::{
    split_ids, Admitted, Arrival, BatchRow, Decisions, FirstToken, KvReady, PassInputs, PassOutput,
    Stepped,
};
pub use local::LocalPorts;
pub use pass::PassMachine;
pub use snapshot::{PreemptionView, QueueView, ResidentView, WorkerSnapshot};

use serde::Serialize;

use futures::FutureExt;

use crate::ids::RequestId;
use crate::policy::admission::{AdmissionParams, AdmissionQueue};
use crate::policy::preemption::victim::VictimKey;
use crate::policy::preemption::{GenPreemption, Mode, Resident};
use crate::pools::{DrafterArena, KvConfig, PoolUsage};

/// Everything a worker is sized and configured with (resolved from the config and the
/// setup decision: `headroom` is 0 when preemption is off).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerParams {
    pub max_batch_size: u32,
    pub max_active: u32,
    pub max_num_tokens: u32,
    /// Tokens a request gains per decode step (1 + accepted draft tokens, rounded).
    pub tokens_per_step: u32,
    #[serde(skip)]
    pub admission: AdmissionParams,
    pub mode: Mode,
    pub victim_key: VictimKey,
    /// Where `tpot_budget`'s window gain g starts (the simulator's `g0=` ablation).
    pub g0: f64,
    /// Which completions step g (the config's `gain_from`, the simulator's `g_from=`).
    pub gain_from: crate::policy::preemption::controller::GainFrom,
    /// The per-request pause limits (SPEC §4.3's; the simulator's `pauses=` ablation).
    pub pause_limits: crate::policy::preemption::PauseLimits,
    pub headroom: u32,
    pub kv: KvConfig,
    /// Recurrent-state bytes per request, for hybrid models.
    pub recurrent_state_bytes: Option<u64>,
    /// Drafter rolling-window tokens, for speculative decoding.
    pub drafter_window: Option<u32>,
}

impl WorkerParams {
    /// A worker with a KV pool of `kv_tokens` tokens and no recurrent or drafter state.
    pub fn simple(max_batch_size: u32, mode: Mode, headroom: u32, kv_tokens: u64) -> Self {
        let tpb = 32;
        Self {
            max_batch_size,
            max_active: max_batch_size,
            max_num_tokens: 8192,
            tokens_per_step: 1,
            admission: AdmissionParams::default(),
            mode,
            victim_key: VictimKey::default(),
            g0: crate::policy::preemption::controller::G_START,
            gain_from: Default::default(),
            pause_limits: Default::default(),
            headroom,
            kv: KvConfig {
                tokens_per_block: tpb,
                total_pages: (kv_tokens / tpb as u64).min(u32::MAX as u64) as u32,
                index_rows: max_batch_size + headroom,
                sliding_window: None,
                headroom_rows: headroom,
            },
            recurrent_state_bytes: None,
            drafter_window: None,
        }
    }

    pub fn residents_capacity(&self) -> u32 {
        self.max_active + self.headroom
    }

    /// One line on what this worker runs, for the server's start: slots, batch limits, the
    /// queue and its target X, the preemption mode (with its paused cap), the KV pool.
    pub fn summary(&self) -> String {
        use crate::policy::names::name;
        let a = &self.admission;
        let x = match (a.policy, a.fixed_target) {
            (crate::policy::AdmissionPolicy::Fcfs, _) => "no X".to_string(),
            (_, Some(x)) => format!("X fixed at {x} s"),
            (_, None) => format!(
                "X = p{} of the last {} waited TTFTs (from {})",
                a.ttft_percentile, a.target_window, a.min_samples
            ),
        };
        let preemption = match self.mode {
            Mode::Off => "off".to_string(),
            Mode::TpotBudget(b) => format!(
                "tpot_budget {b} (g starts at {}{}), paused cap {}",
                self.g0,
                self.gain_from.note(),
                self.headroom
            ),
            Mode::TargetOutputTps(t) => {
                format!("target_output_tps {t}, paused cap {}", self.headroom)
            }
        };
        format!(
            "scheduler: {} slots; batch up to {} rows and {} tokens; queue {}, {x}, up to {} \
             waiting; preemption {preemption}; KV {} pages of {} tokens ({} tokens a slot)",
            self.max_active,
            self.max_batch_size,
            self.max_num_tokens,
            name(&a.policy),
            a.max_waiting,
            self.kv.total_pages,
            self.kv.tokens_per_block,
            u64::from(self.kv.total_pages) * u64::from(self.kv.tokens_per_block)
                / u64::from(self.max_active.max(1)),
        )
    }
}

/// The worker's part of a resident's record; the controller's part is its `Resident` row
/// (the table keeps both). Sixteen bytes: every pass reads it for every resident, next to
/// its 56-byte row.
#[derive(Debug, Clone, Copy, Serialize)]
struct Res {
    context_tokens: u32,
    slot: u32,
    /// Tokens its KV pages hold (pages × tokens_per_block): the pool is asked only to grow.
    kv_capacity: u32,
    waited: bool,
    /// `Res::KV_READY`, `PAUSED`, `STARTED` and `IN_HEAD`, in one byte: the batch walk
    /// tells whether a row joins from this byte alone.
    state: u8,
}

impl Res {
    /// Its KV cache arrived (the transfer time went to the admission queue then).
    const KV_READY: u8 = 1;
    /// Paused by the preemption controller (mirrors its decisions, checked by the invariants).
    const PAUSED: u8 = 2;
    /// Its first token is counted (mirrors the row's `first_token_time`).
    const STARTED: u8 = 4;
    /// In this pass's batch head (a first token or a forced resume): set around the batch
    /// walk, which passes over it.
    const IN_HEAD: u8 = 8;

    fn new(context_tokens: u32, slot: u32, kv_capacity: u32, waited: bool) -> Self {
        Self {
            context_tokens,
            slot,
            kv_capacity,
            waited,
            state: 0,
        }
    }

    fn is(&self, flag: u8) -> bool {
        self.state & flag != 0
    }

    fn set(&mut self, flag: u8, on: bool) {
        self.state = if on {
            self.state | flag
        } else {
            self.state & !flag
        };
    }

    /// KV arrived and not paused: it can be in a batch.
    fn ready(&self) -> bool {
        self.state & (Self::KV_READY | Self::PAUSED) == Self::KV_READY
    }

    /// Tokens its KV cache must hold after this pass's step.
    fn kv_need(&self, v: &Resident, tokens_per_step: u32) -> u32 {
        let out_after = if v.first_token_time.is_none() {
            1
        } else {
            v.output_tokens
        };
        self.context_tokens + out_after + tokens_per_step - 1
    }

    /// Tokens in the KV cache before this step (the last host token is the step's input).
    fn cached_tokens(&self, v: &Resident) -> u32 {
        self.context_tokens + v.output_tokens.saturating_sub(1)
    }
}

/// Cumulative counts, for metrics and the end-of-run summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WorkerTotals {
    pub arrivals: u64,
    pub rejected: u64,
    pub admitted: u64,
    pub completed: u64,
    pub cancelled: u64,
    pub displaced: u64,
    pub kv_waits: u64,
    /// Residents aborted by a stalled pass (`policy::kv_stall`).
    pub kv_aborts: u64,
}

/// One worker's scheduling state: the pass machine and the component cores it drives
/// directly (the simulator's worker; the server runs the same pass against actors).
#[derive(Debug, Clone)]
pub struct WorkerCore {
    machine: PassMachine,
    parts: LocalPorts,
}

impl WorkerCore {
    pub fn new(params: WorkerParams) -> Self {
        Self {
            parts: LocalPorts::new(&params),
            machine: PassMachine::new(params),
        }
    }

    pub fn params(&self) -> &WorkerParams {
        self.machine.params()
    }
    pub fn queue(&self) -> &AdmissionQueue {
        &self.parts.queue
    }
    pub fn preemption(&self) -> &GenPreemption {
        &self.parts.preempt
    }
    pub fn preemption_mut(&mut self) -> &mut GenPreemption {
        &mut self.parts.preempt
    }
    pub fn totals(&self) -> WorkerTotals {
        self.machine.totals()
    }
    pub fn resident_count(&self) -> usize {
        self.machine.resident_count()
    }
    pub fn is_resident(&self, id: RequestId) -> bool {
        self.machine.is_resident(id)
    }
    /// KV pages of a resident request (its page table).
    pub fn pages_of(&mut self, id: RequestId) -> Option<Vec<u32>> {
        self.parts.kv.pages_of(id)
    }
    pub fn drafter(&self) -> Option<&DrafterArena> {
        self.parts.drafter.as_ref()
    }
    /// Nothing queued and nothing resident.
    pub fn is_idle(&self) -> bool {
        self.machine.resident_count() == 0 && self.parts.queue.is_empty()
    }

    pub fn pool_usage(&self) -> Vec<PoolUsage> {
        self.parts.pool_usage()
    }

    /// One scheduling pass.
    pub fn pass(&mut self, inp: &PassInputs) -> PassOutput {
        let mut out = PassOutput::default();
        self.pass_into(inp, &mut out);
        out
    }

    /// One scheduling pass into `out`, every field overwritten: a caller that keeps `out`
    /// across passes reuses its buffers, and the pass then allocates next to nothing.
    pub fn pass_into(&mut self, inp: &PassInputs, out: &mut PassOutput) {
        let ran = self
            .machine
            .run(&mut self.parts, inp, out)
            .now_or_never()
            .is_some();
        // The local ports answer every call at once, so the pass never waits.
        debug_assert!(ran, "a pass over the local ports waited");
        if !ran {
            tracing::error!("a pass over the local ports waited: its decisions are incomplete");
        }
    }

    /// Invariants every pass must keep (checked by property tests).
    pub fn check_invariants(&self, last: &PassOutput) -> Result<(), String> {
        let n = self.machine.residents.len() as u32;
        if last.batch.len() as u32 > self.machine.params.max_batch_size {
            return Err(format!("batch {} > max_batch_size", last.batch.len()));
        }
        if let Some(id) = last
            .batch
            .iter()
            .find(|r| self.parts.preempt.is_paused(r.id))
        {
            return Err(format!("paused request {} is in the batch", id.id));
        }
        if self.parts.preempt.paused_count() as u32 > self.parts.preempt.paused_cap() {
            return Err("paused count over the cap".into());
        }
        if n > self.machine.params.residents_capacity() {
            return Err(format!(
                "{n} residents > capacity {}",
                self.machine.params.residents_capacity()
            ));
        }
        if self.parts.slots.used() != n || self.parts.kv.used_rows() != n {
            return Err(format!(
                "pool accounting: {n} residents, {} slots, {} kv rows",
                self.parts.slots.used(),
                self.parts.kv.used_rows()
            ));
        }
        if self.parts.recurrent.as_ref().is_some_and(|p| p.used() != n)
            || self.parts.drafter.as_ref().is_some_and(|p| p.used() != n)
        {
            return Err("recurrent/drafter accounting".into());
        }
        if let Some(id) = self
            .parts
            .preempt
            .paused_ids()
            .find(|id| !self.machine.residents.contains_key(id))
        {
            return Err(format!("paused request {id} is not resident"));
        }
        if let Some((r, _)) = self
            .machine
            .residents
            .values()
            .find(|(v, x)| x.is(Res::PAUSED) != self.parts.preempt.is_paused(v.id))
        {
            return Err(format!(
                "request {}: the table's paused flag disagrees with the controller",
                r.id
            ));
        }
        if let Some((r, _)) = self
            .machine
            .residents
            .values()
            .find(|(v, x)| x.is(Res::STARTED) != v.first_token_time.is_some())
        {
            return Err(format!(
                "request {}: the table's started flag disagrees with its first token",
                r.id
            ));
        }
        // The step backend addresses a request's recurrent state and drafter window by its
        // sequence slot: the three index pools must give every resident the same index.
        for (v, x) in self.machine.residents.values() {
            let state = self.parts.recurrent.as_ref().map(|p| p.index_of(v.id));
            let draft = self.parts.drafter.as_ref().map(|d| d.slot_of(v.id));
            if [state, draft]
                .into_iter()
                .flatten()
                .any(|i| i != Some(x.slot))
            {
                return Err(format!(
                    "request {}: sequence slot {}, recurrent state {state:?}, drafter slot \
                     {draft:?}",
                    v.id, x.slot
                ));
            }
        }
        self.parts.kv.check_invariants()?;
        if let Some(d) = &self.parts.drafter {
            d.check_invariants()?;
            for id in self.parts.preempt.paused_ids() {
                if !d.is_retained(id) {
                    return Err(format!("paused request {id} lost its drafter retention"));
                }
            }
        }
        Ok(())
    }

    /// The state of every component, for `/debug/actors` and the simulator's traces.
    pub fn snapshot(&self, now: f64) -> WorkerSnapshot {
        snapshot::build(self, now)
    }
}

#[cfg(test)]
mod tests;

//! `CudaBackend`: the CUDA implementation of `StepBackend`. Context arrival either runs a
//! real prefill on the prefill stream (`context: prefill`) or writes the request's KV pages
//! with seeded values at a configured bandwidth, beside the decode steps (`context:
//! transfer`, `transfer.rs`); decode steps run on the decode stream, replayed from CUDA
//! graphs per batch bucket, over a paged KV cache whose pages are the KV pool's pages. Each
//! row's token is sampled on the device with its request's parameters (`sample.cu`).
//!
//! With a drafter (`CudaConfig::drafter`) every step is a verify pass: prompt lookup over each
//! request's window in the drafter arena on the device (at its sequence slot), k + 1 rows
//! per request through the model, the accepted drafts and one more token emitted
//! (`draft.cu`, `draft.rs`). A hybrid shape keeps one recurrent state per sequence slot
//! (`forward::StateCache`, `recurrent.cu`).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{sys, CudaEvent, CudaGraph};

use super::device::{DevBuf, Gpu, Which, A};
use super::draft::{self, DraftConfig};
use super::forward::{
    enqueue, invariant_splits, splits_for, uneven_rows, KvCache, Pass, Scratch, StateCache,
};
use super::model_files::ModelFiles;
use super::residents::Residents;
use super::row_order;
use super::shape::ModelShape;
use super::staging::{RowInput, Staging, StagingTargets};
use super::step_options::{AttnGrid, StepOptions};
use super::transfer::{ContextMode, TransferLane};
use super::weights::{ModelSource, Weights};
use crate::gpu::{
    Arrived, BackendCapacity, BackendError, ContextArrival, ContextLane, StepBackend, StepOutput,
    StepRow,
};
use crate::ids::RequestId;
use crate::pools::drafter::DrafterLayout;
use crate::sampling::SampleRow;

/// Settings of the CUDA backend.
#[derive(Debug, Clone)]
pub struct CudaConfig {
    pub model: ModelSource,
    /// CUDA device ordinal.
    pub device: usize,
    /// Most rows in one decode step; CUDA graphs are captured up to it.
    pub max_batch_size: usize,
    pub tokens_per_block: usize,
    /// KV pages to allocate; `None` takes `kv_memory_fraction` of the memory left free.
    pub kv_pages: Option<usize>,
    pub kv_memory_fraction: f64,
    /// Longest sequence (prompt + output) a request may reach.
    pub max_context: usize,
    /// Prompt tokens per prefill pass.
    pub prefill_chunk: usize,
    /// Replay decode steps from CUDA graphs (else launch eagerly).
    pub cuda_graphs: bool,
    /// Resident requests (active + paused) the backend accepts.
    pub max_resident: usize,
    /// The model's end-of-sequence token: never sampled while a request has produced fewer
    /// than its `min_tokens`.
    pub eos_token: Option<u32>,
    /// How a request's context arrives.
    pub context: ContextMode,
    /// Speculative decoding by prompt lookup; `None` = one token per step.
    pub drafter: Option<DraftConfig>,
    /// How passes are launched; `None` reads the environment (`StepOptions::from_env`).
    pub step: Option<StepOptions>,
}

impl CudaConfig {
    pub fn new(model: ModelSource) -> Self {
        CudaConfig {
            model,
            device: 0,
            max_batch_size: 128,
            tokens_per_block: 32,
            kv_pages: None,
            kv_memory_fraction: 0.9,
            max_context: 32 * 1024 + 1024,
            prefill_chunk: 512,
            cuda_graphs: true,
            max_resident: 176,
            eos_token: None,
            context: ContextMode::Prefill,
            drafter: None,
            step: None,
        }
    }
}

/// How a decode step is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    Graph,
    Eager,
}

pub struct CudaBackend {
    cfg: CudaConfig,
    shape: ModelShape,
    // Field order is drop order: graphs and buffers before the streams and context in `gpu`.
    /// (bucket, balanced attention grid, graph): with `AttnGrid::Auto` a bucket of one
    /// attention split a row has a graph of each grid.
    graphs: Vec<(usize, bool, CudaGraph)>,
    dec: Scratch,
    /// The decode step's page-locked inputs and tokens.
    dec_staging: Staging,
    pre: Scratch,
    kv: KvCache,
    /// A hybrid shape's recurrent states, one per sequence slot.
    states: Option<StateCache>,
    /// The drafter arena and the verify pass's inputs, when drafting.
    draft: Option<DraftDev>,
    weights: Weights,
    /// Events around each decode step's kernels, when the bench asks (`time_device`).
    step_events: Option<(CudaEvent, CudaEvent)>,
    gpu: Gpu,
    reqs: Residents,
    table_width: usize,
    /// `context: transfer`: the arrival side, shared with the arrival threads.
    lane: Option<Arc<TransferLane>>,
}

/// The drafter's device side: the arena (`DrafterLayout`: one slot per sequence slot, one
/// scratch row per batch row) and the per-batch-row inputs and outputs of a verify pass.
struct DraftDev {
    cfg: DraftConfig,
    layout: DrafterLayout,
    arena: DevBuf,
    /// Each batch row's page table; `draft_lookup` copies it to the row's k + 1 pass rows.
    batch_table: DevBuf,
    slot: DevBuf,
    ctx: DevBuf,
    last: DevBuf,
    cap: DevBuf,
    n_out: DevBuf,
}

impl DraftDev {
    fn new(
        gpu: &Gpu,
        cfg: DraftConfig,
        slots: usize,
        mb: usize,
        tw: usize,
    ) -> Result<Self, BackendError> {
        let layout = DrafterLayout::new(slots as u32, mb as u32, cfg.window);
        let a = |n: usize| gpu.alloc(n, Which::Decode);
        Ok(DraftDev {
            cfg,
            layout,
            arena: a(layout.bytes() as usize)?,
            batch_table: a(mb * tw * 4)?,
            slot: a(mb * 4)?,
            ctx: a(mb * 4)?,
            last: a(mb * 4)?,
            cap: a(mb * 4)?,
            n_out: a(mb * 4)?,
        })
    }

    /// Rows of a verify pass per batch row.
    fn rows_per(&self) -> usize {
        self.cfg.max_draft_len as usize + 1
    }
}

// SAFETY: the backend owns its context, streams, cuBLAS handles and graphs, and is used by one
// thread at a time (`&mut self`); every entry point binds the context to the calling thread.
unsafe impl Send for CudaBackend {}

/// Decode batch buckets up to `max`: 1, 2, 4, 8, then every multiple of 16, then `max`.
pub fn buckets(max: usize) -> Vec<usize> {
    let mut b: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|&x| x < max).collect();
    b.extend((16..max).step_by(16));
    b.push(max.max(1));
    b
}

/// Attention splits of a pass of `rows` rows on `gpu` (its multiprocessors and split
/// target); a decode pass in batch-invariant mode takes the count of `max_context` instead,
/// whatever its rows.
fn pass_splits(gpu: &Gpu, kv_heads: usize, rows: usize, decode: Option<usize>) -> usize {
    match decode {
        Some(max_context) if gpu.k.opts.batch_invariant => invariant_splits(max_context),
        _ => splits_for(rows, kv_heads, gpu.sm_count, gpu.k.opts.attn_blocks_per_sm),
    }
}

impl CudaBackend {
    /// Probes the libraries (a clear `Unavailable` when absent), creates the context,
    /// compiles the kernels, places the weights, allocates the KV cache and captures graphs.
    pub fn new(cfg: CudaConfig) -> Result<Self, BackendError> {
        super::probe::probe_libraries()?;
        if cfg.max_batch_size == 0
            || cfg.tokens_per_block == 0
            || cfg.prefill_chunk == 0
            || cfg.max_context == 0
            || cfg.kv_pages == Some(0)
        {
            return Err(BackendError::Failed(
                "max_batch_size, tokens_per_block, prefill_chunk, max_context and kv_pages \
                 must be > 0"
                    .into(),
            ));
        }
        if let ContextMode::Transfer { gbps } = cfg.context {
            if !(gbps > 0.0 && gbps.is_finite()) {
                return Err(BackendError::Failed(format!(
                    "context transfer at {gbps} GB/s: the bandwidth must be > 0"
                )));
            }
        }
        if let Some(d) = &cfg.drafter {
            d.validate().map_err(BackendError::Failed)?;
        }
        let files = match &cfg.model {
            ModelSource::Seeded { .. } => None,
            ModelSource::Checkpoint(path) => {
                Some(ModelFiles::open(path).map_err(|e| BackendError::Failed(e.to_string()))?)
            }
        };
        let shape = match (&cfg.model, &files) {
            (_, Some(f)) => f.shape.clone(),
            (ModelSource::Seeded { shape, .. }, None) => {
                ModelShape::named(shape).map_err(|e| BackendError::Failed(e.to_string()))?
            }
            (ModelSource::Checkpoint(_), None) => unreachable!("opened above"),
        };
        shape
            .validate()
            .map_err(|e| BackendError::Failed(e.to_string()))?;
        if shape.recurrent_layers() > 0 {
            if cfg.drafter.is_some() {
                return Err(BackendError::Failed(format!(
                    "shape {}: drafting is not supported with recurrent layers (their state \
                     cannot be rolled back past rejected drafts)",
                    shape.name
                )));
            }
            if cfg.context != ContextMode::Prefill {
                return Err(BackendError::Failed(format!(
                    "shape {}: a hybrid model needs `context: prefill` (the transfer stand-in \
                     brings KV, not recurrent states)",
                    shape.name
                )));
            }
        }
        if let Some(eos) = cfg.eos_token {
            if eos as usize >= shape.vocab {
                return Err(BackendError::Failed(format!(
                    "eos token {eos} is outside the vocabulary ({})",
                    shape.vocab
                )));
            }
        }
        let opts = match cfg.step {
            Some(o) => o,
            None => StepOptions::from_env()?,
        };
        let gpu = Gpu::new(cfg.device, (shape.head_dim, shape.group()), opts)?;
        tracing::info!(
            "cuda backend: {} on {}: {}",
            shape.name,
            gpu.name,
            opts.describe()
        );
        let weights = Weights::alloc(&gpu, &shape)?;
        match (&cfg.model, &files) {
            (_, Some(f)) => weights.fill_from(&gpu, f)?,
            (ModelSource::Seeded { seed, .. }, None) => weights.fill_seeded(&gpu, &shape, *seed)?,
            (ModelSource::Checkpoint(_), None) => unreachable!("opened above"),
        }
        drop(files);
        let table_width = cfg.max_context.div_ceil(cfg.tokens_per_block);
        let kvh = shape.kv_heads;
        let mb = cfg.max_batch_size;
        // A verify pass runs k + 1 rows per batch row.
        let per = cfg.drafter.map_or(1, |d| d.max_draft_len as usize + 1);
        let dec_rows = mb * per;
        // Eager steps run the exact row count, graphs the bucket: size for both.
        let dec_parts = (1..=mb)
            .map(|b| b * per * pass_splits(&gpu, kvh, b * per, Some(cfg.max_context)))
            .max()
            .unwrap_or(1);
        // The balanced attention's slots: one a (row, kv head) and one a warp of its grid,
        // which is widest for the fewest rows (`forward::balanced_launch`).
        let dec_parts = match gpu.balanced_grid(1, shape.head_dim)? {
            Some(g) => dec_parts.max(dec_rows + g.warps.div_ceil(kvh)),
            None => dec_parts,
        };
        let dec = Scratch::new(
            &gpu,
            &shape,
            Which::Decode,
            dec_rows,
            table_width,
            dec_parts,
            dec_rows,
        )?;
        dec.one_segment_per_row(&gpu, Which::Decode)?;
        let pc = cfg.prefill_chunk;
        let pre_parts = (1..=pc)
            .map(|r| r * pass_splits(&gpu, kvh, r, None))
            .max()
            .unwrap_or(1);
        let pre = Scratch::new(&gpu, &shape, Which::Prefill, pc, table_width, pre_parts, 1)?;
        let page_bytes = shape.kv_bytes_per_token() as usize * cfg.tokens_per_block;
        let num_pages = match cfg.kv_pages {
            Some(n) => n,
            None => {
                let (free, _) = gpu
                    .ctx
                    .mem_get_info()
                    .map_err(super::device::drv("memory info"))?;
                ((free as f64 * cfg.kv_memory_fraction) as usize / page_bytes).max(1)
            }
        };
        let kv = KvCache::new(&gpu, &shape, num_pages, cfg.tokens_per_block)?;
        let states = StateCache::new(&gpu, &shape, cfg.max_resident)?;
        let draft = match cfg.drafter {
            Some(d) => Some(DraftDev::new(&gpu, d, cfg.max_resident, mb, table_width)?),
            None => None,
        };
        let lane = match cfg.context {
            ContextMode::Prefill => None,
            ContextMode::Transfer { gbps } => Some(Arc::new(TransferLane::new(
                &gpu,
                &kv,
                &shape,
                gbps,
                cfg.max_context,
                cfg.eos_token,
            )?)),
        };
        let dec_staging = Staging::new(
            &gpu.ctx,
            dec.input_layout,
            StagingTargets {
                inputs: dec.inputs.ptr,
                table: dec.table.ptr,
                table_width,
                tokens: dec.out_tok.ptr,
            },
        )?;
        gpu.sync(Which::Decode)?;
        gpu.sync(Which::Prefill)?;
        let mut b = CudaBackend {
            cfg,
            shape,
            graphs: Vec::new(),
            dec,
            dec_staging,
            pre,
            kv,
            weights,
            step_events: None,
            gpu,
            reqs: Residents::default(),
            table_width,
            lane,
            states,
            draft,
        };
        if b.cfg.cuda_graphs {
            b.capture_graphs()?;
        }
        Ok(b)
    }

    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }
    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }
    /// How this backend launches its passes.
    pub fn step_options(&self) -> StepOptions {
        self.gpu.k.opts
    }
    /// Attention splits of a decode pass of `rows` rows (before `forward::live_splits`).
    pub fn decode_splits(&self, rows: usize) -> usize {
        let max_context = Some(self.cfg.max_context);
        pass_splits(&self.gpu, self.shape.kv_heads, rows, max_context)
    }
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes
    }
    pub fn kv_pages(&self) -> usize {
        self.kv.num_pages
    }
    pub fn capacity_page_size(&self) -> usize {
        self.kv.page_size
    }
    pub fn sm_count(&self) -> u32 {
        self.gpu.sm_count
    }
    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub(crate) fn kv_cache(&self) -> &KvCache {
        &self.kv
    }
    /// 4 device bytes a probe kernel may write: the first of the decode logits, which every
    /// step overwrites.
    pub(crate) fn probe_sink(&self) -> u64 {
        self.dec.logits.ptr
    }

    fn bucket_for(&self, rows: usize) -> usize {
        buckets(self.cfg.max_batch_size)
            .into_iter()
            .find(|&b| b >= rows)
            .unwrap_or(rows)
    }

    fn decode_pass(&self, rows: usize, balanced: bool) -> Pass {
        Pass {
            rows,
            splits: self.decode_splits(rows),
            table_stride: self.table_width,
            logits_row0: 0,
            logits_rows: rows,
            segments: rows,
            kv_settled: true,
            balanced,
        }
    }

    /// Whether a decode step over `rows` runs its attention on the balanced grid
    /// (`StepOptions::attn_grid`; `forward::uneven_rows` decides for `Auto`).
    fn balanced_for(&self, rows: &[StepRow]) -> bool {
        let o = &self.gpu.k.opts;
        match o.attn_grid {
            AttnGrid::Split => false,
            AttnGrid::Balanced => true,
            AttnGrid::Auto => uneven_rows(
                rows.iter().map(|r| r.context_len as usize + 1),
                self.shape.kv_heads,
                self.gpu.sm_count,
                o.attn_blocks_per_sm,
            ),
        }
    }

    /// The grids a bucket's graphs are captured for: one, or with `AttnGrid::Auto` both
    /// where the bucket's pass has one attention split a row (the balanced grid takes no
    /// other pass).
    fn grids_for(&self, bucket: usize) -> &'static [bool] {
        if self.draft.is_some() {
            // A drafter's step is its verify pass, which keeps the split grid.
            return &[false];
        }
        match self.gpu.k.opts.attn_grid {
            AttnGrid::Split => &[false],
            AttnGrid::Balanced => &[true],
            AttnGrid::Auto if self.decode_splits(bucket) == 1 => &[false, true],
            AttnGrid::Auto => &[false],
        }
    }

    /// Bytes of the recurrent states (0 without recurrent layers), for the roofline.
    pub fn state_bytes(&self) -> usize {
        self.states.as_ref().map_or(0, StateCache::bytes)
    }

    /// Enqueues one forward pass of this model on `w`'s stream over scratch `sc`.
    fn enqueue_pass(&self, w: Which, sc: &Scratch, pass: Pass) -> Result<(), BackendError> {
        enqueue(
            &self.gpu,
            w,
            &self.shape,
            &self.weights,
            &self.kv,
            self.states.as_ref(),
            sc,
            pass,
        )
    }

    /// Enqueues one decode step over `n` batch rows on the decode stream: a plain pass, or
    /// with a drafter the lookup, the verify pass over n(k + 1) rows and the acceptance.
    /// `balanced`: the plain pass's attention grid (a drafter's verify pass keeps the split
    /// grid).
    fn enqueue_step(&self, n: usize, balanced: bool) -> Result<(), BackendError> {
        let w = Which::Decode;
        let Some(d) = &self.draft else {
            return self.enqueue_pass(w, &self.dec, self.decode_pass(n, balanced));
        };
        let stride = d.layout.stride() as i32;
        let slots = d.layout.request_slots as i32;
        let k = d.cfg.max_draft_len as i32;
        self.gpu.launch(
            w,
            &self.gpu.k.draft_lookup,
            (n as u32, 1, 1),
            256,
            &[
                A::P(d.arena.ptr),
                A::I(stride),
                A::I(slots),
                A::P(d.slot.ptr),
                A::P(d.ctx.ptr),
                A::P(d.last.ptr),
                A::P(d.cap.ptr),
                A::I(d.cfg.max_ngram as i32),
                A::I(k),
                A::P(d.batch_table.ptr),
                A::I(self.table_width as i32),
                A::P(self.dec.tokens.ptr),
                A::P(self.dec.pos.ptr),
                A::P(self.dec.lens.ptr),
                A::P(self.dec.table.ptr),
            ],
        )?;
        // A row's drafts read the K and V that the row's other positions write in this pass.
        let verify = Pass {
            kv_settled: false,
            ..self.decode_pass(n * d.rows_per(), false)
        };
        self.enqueue_pass(w, &self.dec, verify)?;
        self.gpu.launch(
            w,
            &self.gpu.k.draft_accept,
            ((n as u32).div_ceil(128), 1, 1),
            128,
            &[
                A::P(d.arena.ptr),
                A::I(stride),
                A::I(slots),
                A::P(d.slot.ptr),
                A::I(n as i32),
                A::I(k),
                A::P(self.dec.out_tok.ptr),
                A::P(d.n_out.ptr),
            ],
        )
    }

    /// Captures one decode graph per bucket (after an eager warm-up on padding rows).
    fn capture_graphs(&mut self) -> Result<(), BackendError> {
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(super::device::drv("bind context"))?;
        let mb = self.cfg.max_batch_size;
        let rows = self.dec.rows;
        self.gpu
            .htod(Which::Decode, self.dec.lens.ptr, &vec![0i32; rows])?;
        self.gpu.htod(
            Which::Decode,
            self.dec.samp.ptr,
            &vec![SampleRow::GREEDY; rows],
        )?;
        if let Some(d) = &self.draft {
            // Padding batch rows: no slot, no context (the lookup and acceptance skip them).
            self.gpu.htod(Which::Decode, d.slot.ptr, &vec![-1i32; mb])?;
            self.gpu.htod(Which::Decode, d.ctx.ptr, &vec![-1i32; mb])?;
        }
        let mut graphs = Vec::new();
        for b in buckets(mb) {
            for &balanced in self.grids_for(b) {
                self.enqueue_step(b, balanced)?;
                self.gpu.sync(Which::Decode)?;
                let s = &self.gpu.decode;
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(super::device::drv("begin capture"))?;
                let r = self.enqueue_step(b, balanced);
                let g = s.end_capture(sys::CUgraphInstantiate_flags(0));
                r?;
                let g = g.map_err(super::device::drv("end capture"))?;
                let g = g.ok_or_else(|| {
                    BackendError::Failed("graph capture produced no graph".into())
                })?;
                graphs.push((b, balanced, g));
            }
        }
        self.graphs = graphs;
        Ok(())
    }

    fn check_pages(&self, id: RequestId, pages: &[u32], tokens: usize) -> Result<(), BackendError> {
        if tokens > self.cfg.max_context {
            return Err(BackendError::Failed(format!(
                "request {id}: {tokens} tokens exceed max_context {}",
                self.cfg.max_context
            )));
        }
        let need = tokens.div_ceil(self.kv.page_size);
        if pages.len() < need {
            return Err(BackendError::Failed(format!(
                "request {id}: {} pages cannot hold {tokens} tokens ({need} needed)",
                pages.len()
            )));
        }
        if let Some(p) = pages[..need]
            .iter()
            .find(|&&p| p as usize >= self.kv.num_pages)
        {
            return Err(BackendError::Failed(format!(
                "request {id}: page {p} is outside the KV cache ({} pages)",
                self.kv.num_pages
            )));
        }
        Ok(())
    }

    /// A step's rows, before anything reaches the device: each row's pages hold its next
    /// position, its input token is in the vocabulary and its slot is in range.
    fn check_rows(&self, rows: &[StepRow]) -> Result<(), BackendError> {
        for r in rows {
            self.check_pages(r.id, &r.pages, r.context_len as usize + 1)?;
            self.check_token(r.id, r.last_token)?;
            self.check_slot(r.id, r.slot)?;
        }
        Ok(())
    }

    fn check_token(&self, id: RequestId, t: u32) -> Result<(), BackendError> {
        if t as usize >= self.shape.vocab {
            return Err(BackendError::Failed(format!(
                "request {id}: token {t} outside the vocabulary ({})",
                self.shape.vocab
            )));
        }
        Ok(())
    }

    /// Real prefill of `prompt` into `pages` on the prefill stream; returns the greedy first
    /// token and the last position's logits.
    pub fn prefill(
        &mut self,
        id: RequestId,
        prompt: &[u32],
        pages: &[u32],
    ) -> Result<(u32, Vec<f32>), BackendError> {
        self.prefill_sampled(id, prompt, pages, SampleRow::GREEDY)
    }

    /// [`prefill`](Self::prefill) with the first token drawn by `sample`.
    pub fn prefill_sampled(
        &mut self,
        id: RequestId,
        prompt: &[u32],
        pages: &[u32],
        sample: SampleRow,
    ) -> Result<(u32, Vec<f32>), BackendError> {
        self.prefill_in(id, None, prompt, pages, sample)
    }

    /// [`prefill_sampled`](Self::prefill_sampled) of a request in sequence slot `slot`, where
    /// a hybrid model starts its recurrent state (which a hybrid model needs).
    pub fn prefill_in(
        &mut self,
        id: RequestId,
        slot: Option<u32>,
        prompt: &[u32],
        pages: &[u32],
        sample: SampleRow,
    ) -> Result<(u32, Vec<f32>), BackendError> {
        if prompt.is_empty() {
            return Err(BackendError::Failed(format!("request {id}: empty prompt")));
        }
        let state_slot = match (&self.states, slot) {
            (None, _) => -1,
            (Some(_), Some(s)) => s as i32,
            (Some(_), None) => {
                return Err(BackendError::Failed(format!(
                    "request {id}: a hybrid model's prefill needs the request's slot"
                )))
            }
        };
        self.check_pages(id, pages, prompt.len())?;
        for &t in prompt {
            self.check_token(id, t)?;
        }
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(super::device::drv("bind context"))?;
        let w = Which::Prefill;
        let mut table = vec![0i32; self.table_width];
        let need = prompt.len().div_ceil(self.kv.page_size);
        for (d, &p) in table.iter_mut().zip(&pages[..need]) {
            *d = p as i32;
        }
        self.gpu.htod(w, self.pre.table.ptr, &table)?;
        self.gpu.htod(w, self.pre.samp.ptr, &[sample])?;
        if let Some(st) = &self.states {
            st.clear(&self.gpu, w, state_slot as u32)?;
            self.gpu.htod(w, self.pre.seg_slot.ptr, &[state_slot])?;
            self.gpu.htod(w, self.pre.seg_row0.ptr, &[0i32])?;
        }
        let chunk = self.cfg.prefill_chunk;
        let mut c0 = 0;
        while c0 < prompt.len() {
            let c1 = (c0 + chunk).min(prompt.len());
            let n = c1 - c0;
            let toks: Vec<i32> = prompt[c0..c1].iter().map(|&t| t as i32).collect();
            let pos: Vec<i32> = (c0..c1).map(|p| p as i32).collect();
            let lens: Vec<i32> = (c0..c1).map(|p| p as i32 + 1).collect();
            self.gpu.htod(w, self.pre.tokens.ptr, &toks)?;
            self.gpu.htod(w, self.pre.pos.ptr, &pos)?;
            self.gpu.htod(w, self.pre.lens.ptr, &lens)?;
            if self.states.is_some() {
                self.gpu.htod(w, self.pre.seg_rows.ptr, &[n as i32])?;
            }
            let last = c1 == prompt.len();
            let pass = Pass {
                rows: n,
                splits: pass_splits(&self.gpu, self.shape.kv_heads, n, None),
                table_stride: 0,
                logits_row0: n - 1,
                logits_rows: last as usize,
                segments: 1,
                kv_settled: false,
                balanced: false,
            };
            self.enqueue_pass(w, &self.pre, pass)?;
            // The host input vectors are reused next chunk; pageable copies are staged.
            c0 = c1;
        }
        let mut logits = vec![0f32; self.shape.vocab];
        self.gpu.dtoh(w, &mut logits, self.pre.logits.ptr)?;
        let mut tok = [0i32; 1];
        self.gpu.dtoh(w, &mut tok, self.pre.out_tok.ptr)?;
        Ok((tok[0] as u32, logits))
    }

    /// One greedy decode step over `rows` (each consumes its `last_token` at position
    /// `context_len`); returns the tokens and, when asked, each row's logits.
    pub fn decode(
        &mut self,
        rows: &[StepRow],
        launch: Launch,
        want_logits: bool,
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>), BackendError> {
        let greedy = vec![SampleRow::GREEDY; rows.len()];
        self.decode_sampled(rows, &greedy, launch, want_logits)
    }

    /// [`decode`](Self::decode) with row i's token drawn by `samples[i]`. The rows go to
    /// the GPU longest context first (`StepOptions::longest_first`, `row_order.rs`); tokens
    /// and logits come back in the order of `rows`.
    pub fn decode_sampled(
        &mut self,
        rows: &[StepRow],
        samples: &[SampleRow],
        launch: Launch,
        want_logits: bool,
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>), BackendError> {
        if self.gpu.k.opts.longest_first && samples.len() == rows.len() {
            let lens: Vec<u32> = rows.iter().map(|r| r.context_len).collect();
            if let Some(order) = row_order::longest_first(&lens) {
                let (sent, sent_samples) = (
                    row_order::permuted(rows, &order),
                    row_order::permuted(samples, &order),
                );
                let (tokens, logits) =
                    self.decode_in_order(&sent, &sent_samples, launch, want_logits)?;
                return Ok((
                    row_order::restored(tokens, &order),
                    row_order::restored(logits, &order),
                ));
            }
        }
        self.decode_in_order(rows, samples, launch, want_logits)
    }

    /// [`decode_sampled`](Self::decode_sampled) with the rows in the order given.
    fn decode_in_order(
        &mut self,
        rows: &[StepRow],
        samples: &[SampleRow],
        launch: Launch,
        want_logits: bool,
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>), BackendError> {
        let b = rows.len();
        if b == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        if self.draft.is_some() {
            return Err(BackendError::Failed(
                "a drafting backend steps through `decode_verify`".into(),
            ));
        }
        if b > self.cfg.max_batch_size {
            return Err(BackendError::Failed(format!(
                "{b} rows exceed max_batch_size {}",
                self.cfg.max_batch_size
            )));
        }
        if samples.len() != b {
            return Err(BackendError::Failed(format!(
                "{} sampling rows for {b} batch rows",
                samples.len()
            )));
        }
        self.check_rows(rows)?;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(super::device::drv("bind context"))?;
        let balanced = self.balanced_for(rows);
        let graph = self.graph_for(b, launch, balanced);
        let n = graph.map(|(bk, _)| bk).unwrap_or(b);
        let hybrid = self.states.is_some();
        let mut inputs = vec![RowInput::PADDING; n];
        for ((d, r), &sample) in inputs.iter_mut().zip(rows).zip(samples) {
            *d = RowInput {
                sample,
                token: r.last_token as i32,
                pos: r.context_len as i32,
                len: r.context_len as i32 + 1,
                seg_slot: if hybrid { r.slot as i32 } else { -1 },
            };
        }
        let ps = self.kv.page_size;
        let pages: Vec<&[u32]> = rows
            .iter()
            .map(|r| &r.pages[..(r.context_len as usize + 1).div_ceil(ps)])
            .collect();
        let w = Which::Decode;
        let up = self.dec_staging.upload(&self.gpu, w, &inputs, &pages);
        if let Err(e) = up {
            // A copy that was queued may still read the staging buffers.
            let _ = self.gpu.sync(w);
            return Err(e);
        }
        if let Some((e0, _)) = &self.step_events {
            e0.record(self.gpu.stream(w))
                .map_err(super::device::drv("event record"))?;
        }
        let run = self.run_step(graph, n, balanced);
        if let Some((_, e1)) = &self.step_events {
            e1.record(self.gpu.stream(w))
                .map_err(super::device::drv("event record"))?;
        }
        // Waits for the stream whether the step was enqueued or not, so the staging buffers
        // are free for the next step's copies.
        let out = self.dec_staging.read_tokens(&self.gpu, w, b);
        run?;
        let out = out?;
        let mut logits = Vec::new();
        if want_logits {
            let v = self.shape.vocab;
            let mut all = vec![0f32; b * v];
            self.gpu.dtoh(w, &mut all, self.dec.logits.ptr)?;
            logits = all.chunks(v).map(|c| c.to_vec()).collect();
        }
        Ok((out, logits))
    }

    /// The captured graph (bucket, index) that runs `rows` rows on the attention grid
    /// `balanced` asks for, when graphs are asked for: the bucket's only graph where it has
    /// one (the balanced grid takes none of its passes).
    fn graph_for(&self, rows: usize, launch: Launch, balanced: bool) -> Option<(usize, usize)> {
        match launch {
            Launch::Graph => {
                let bk = self.bucket_for(rows);
                let of = |want: Option<bool>| {
                    self.graphs
                        .iter()
                        .position(|(x, b, _)| *x == bk && want.is_none_or(|w| w == *b))
                };
                of(Some(balanced)).or_else(|| of(None)).map(|i| (bk, i))
            }
            Launch::Eager => None,
        }
    }

    /// Replays the graph, or enqueues the step over `n` batch rows eagerly.
    fn run_step(
        &self,
        graph: Option<(usize, usize)>,
        n: usize,
        balanced: bool,
    ) -> Result<(), BackendError> {
        match graph {
            Some((_, i)) => self.graphs[i]
                .2
                .launch()
                .map_err(super::device::drv("graph launch")),
            None => self.enqueue_step(n, balanced),
        }
    }

    /// A sequence slot must address the backend's states and drafter slots.
    fn check_slot(&self, id: RequestId, slot: u32) -> Result<(), BackendError> {
        if (self.states.is_some() || self.draft.is_some()) && slot as usize >= self.cfg.max_resident
        {
            return Err(BackendError::Failed(format!(
                "request {id}: sequence slot {slot} outside the backend's {} (max_resident)",
                self.cfg.max_resident
            )));
        }
        Ok(())
    }

    /// One verify step over `rows` (drafting backends): each row's drafts are looked up on
    /// the device, `samples` holds k + 1 sampling rows per row (its next token's, then each
    /// draft position's). Returns each row's emitted tokens (accepted drafts and one more).
    pub fn decode_verify(
        &mut self,
        rows: &[StepRow],
        samples: &[SampleRow],
        launch: Launch,
    ) -> Result<Vec<Vec<u32>>, BackendError> {
        let Some(per) = self.draft.as_ref().map(DraftDev::rows_per) else {
            return Err(BackendError::Failed("the backend has no drafter".into()));
        };
        let b = rows.len();
        if b == 0 {
            return Ok(Vec::new());
        }
        if b > self.cfg.max_batch_size || samples.len() != b * per {
            return Err(BackendError::Failed(format!(
                "{b} rows (max_batch_size {}) with {} sampling rows ({per} each)",
                self.cfg.max_batch_size,
                samples.len()
            )));
        }
        let (ps, tw, mc) = (self.kv.page_size, self.table_width, self.cfg.max_context);
        let k = per - 1;
        self.check_rows(rows)?;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(super::device::drv("bind context"))?;
        let graph = self.graph_for(b, launch, false);
        let n = graph.map(|(bk, _)| bk).unwrap_or(b);
        let mut slot = vec![-1i32; n];
        let mut ctx = vec![-1i32; n];
        let mut last = vec![0i32; n];
        let mut cap = vec![0i32; n];
        let mut table = vec![0i32; n * tw];
        let mut samp = vec![SampleRow::GREEDY; n * per];
        samp[..b * per].copy_from_slice(samples);
        for (i, r) in rows.iter().enumerate() {
            let c = r.context_len as usize;
            // Drafts only where the pages and max_context hold their KV.
            let room = (r.pages.len() * ps).min(mc).saturating_sub(c + 1);
            let cp = k.min(room);
            slot[i] = r.slot as i32;
            ctx[i] = c as i32;
            last[i] = r.last_token as i32;
            cap[i] = cp as i32;
            let need = (c + 1 + cp).div_ceil(ps);
            for (d, &p) in table[i * tw..].iter_mut().zip(&r.pages[..need]) {
                *d = p as i32;
            }
        }
        let w = Which::Decode;
        if let Some(d) = &self.draft {
            self.gpu.htod(w, d.slot.ptr, &slot)?;
            self.gpu.htod(w, d.ctx.ptr, &ctx)?;
            self.gpu.htod(w, d.last.ptr, &last)?;
            self.gpu.htod(w, d.cap.ptr, &cap)?;
            self.gpu.htod(w, d.batch_table.ptr, &table)?;
        }
        self.gpu.htod(w, self.dec.samp.ptr, &samp)?;
        self.run_step(graph, n, false)?;
        let mut out = vec![0i32; n * per];
        self.gpu.dtoh(w, &mut out, self.dec.out_tok.ptr)?;
        let mut count = vec![0i32; n];
        if let Some(d) = &self.draft {
            self.gpu.dtoh(w, &mut count, d.n_out.ptr)?;
        }
        Ok((0..b)
            .map(|i| {
                let m = (count[i].max(1) as usize).min(per);
                out[i * per..i * per + m]
                    .iter()
                    .map(|&t| t as u32)
                    .collect()
            })
            .collect())
    }

    /// Writes a request's drafter window on the device: the last `window` tokens of
    /// `tokens` (its prompt, then its first token when a prefill produced one).
    fn seed_window(&self, slot: u32, tokens: &[&[u32]]) -> Result<(), BackendError> {
        let Some(d) = &self.draft else {
            return Ok(());
        };
        let r = d.layout.request_range(slot);
        let mut words = vec![0u32; (r.end - r.start) as usize];
        let all: Vec<u32> = tokens.concat();
        let tail = all.len().saturating_sub(d.cfg.window as usize);
        draft::push(&mut words, &all[tail..]);
        self.gpu
            .htod(Which::Decode, d.arena.at(r.start as usize * 4), &words)
    }

    /// Fills the whole KV cache with seeded values (for benchmarks that skip prefill).
    pub fn fill_kv_random(&mut self, seed: u32) -> Result<(), BackendError> {
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(super::device::drv("bind context"))?;
        self.kv.fill_random(&self.gpu, seed)
    }

    /// Records events around each later decode step's kernels (on) or stops (off), so that
    /// `last_step_device_ms` can tell device time from the host's share of a step.
    pub fn time_device(&mut self, on: bool) -> Result<(), BackendError> {
        self.step_events = match on {
            false => None,
            true => {
                let ev = || {
                    self.gpu
                        .ctx
                        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(super::device::drv("event"))
                };
                Some((ev()?, ev()?))
            }
        };
        Ok(())
    }

    /// The device sampler alone: row i of `logits` (rows of `vocab` float32 values, any
    /// vocabulary size) drawn by `samples[i]`, as a step's last kernel draws from the
    /// lm_head's output. For checks against `sampling::sample_row` at vocabularies the model
    /// has not (the kernel reads rows of a multiple of 4 in float4s, others one by one).
    pub fn sample_logits(
        &self,
        logits: &[f32],
        vocab: usize,
        samples: &[SampleRow],
    ) -> Result<Vec<u32>, BackendError> {
        let rows = samples.len();
        if vocab == 0 || logits.len() != rows * vocab || vocab > i32::MAX as usize {
            return Err(BackendError::Failed(format!(
                "{} logits are not {rows} rows of {vocab}",
                logits.len()
            )));
        }
        if rows == 0 {
            return Ok(Vec::new());
        }
        let w = Which::Decode;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(super::device::drv("bind context"))?;
        let lg = self.gpu.alloc(logits.len() * 4, w)?;
        let sp = self.gpu.alloc(std::mem::size_of_val(samples), w)?;
        let out = self.gpu.alloc(rows * 4, w)?;
        self.gpu.htod(w, lg.ptr, logits)?;
        self.gpu.htod(w, sp.ptr, samples)?;
        self.gpu
            .sample_rows(w, lg.ptr, vocab, sp.ptr, out.ptr, rows)?;
        let mut toks = vec![0i32; rows];
        self.gpu.dtoh(w, &mut toks, out.ptr)?;
        Ok(toks.into_iter().map(|t| t as u32).collect())
    }

    /// Milliseconds between the events around the last decode step's kernels (graph replay
    /// or eager launches; not the host's input copies or the token read-back).
    pub fn last_step_device_ms(&self) -> Result<Option<f64>, BackendError> {
        match &self.step_events {
            None => Ok(None),
            Some((e0, e1)) => e0
                .elapsed_ms(e1)
                .map(|ms| Some(ms as f64))
                .map_err(super::device::drv("event time")),
        }
    }
}

impl CudaBackend {
    /// Requests whose KV arrived on a transfer thread join the resident table, their
    /// drafter windows seeded as after a prefill (the prompt's tail, the first token).
    fn take_arrivals(&mut self) -> Result<(), BackendError> {
        if let Some(lane) = &self.lane {
            for (id, landed) in lane.take_arrived() {
                let first = landed.st.first_token;
                self.seed_window(landed.st.slot, &[&landed.prompt, first.as_slice()])?;
                self.reqs.insert(id, landed.st);
            }
        }
        Ok(())
    }

    fn check_room(&self, id: RequestId) -> Result<(), BackendError> {
        let pending = self.lane.as_ref().map_or(0, |l| l.pending());
        if !self.reqs.contains(id) && self.reqs.len() + pending >= self.cfg.max_resident {
            return Err(BackendError::Failed(format!(
                "request {id}: {} residents already (max_resident)",
                self.cfg.max_resident
            )));
        }
        Ok(())
    }
}

impl StepBackend for CudaBackend {
    fn context_arrival(&mut self, req: &ContextArrival) -> Result<Arrived, BackendError> {
        self.take_arrivals()?;
        self.check_room(req.id)?;
        self.check_slot(req.id, req.slot)?;
        if let Some(other) = self.reqs.slot_holder(req.slot, req.id) {
            return Err(BackendError::Failed(format!(
                "request {}: sequence slot {} is held by request {other}",
                req.id, req.slot
            )));
        }
        if let Some(lane) = self.lane.clone() {
            let arrived = lane.context_arrival(req)?;
            self.take_arrivals()?;
            return Ok(arrived);
        }
        let t0 = Instant::now();
        let (st, row) = Residents::arriving(req, self.cfg.eos_token);
        let (tok, _) = self.prefill_in(req.id, Some(req.slot), &req.prompt, &req.pages, row)?;
        self.seed_window(req.slot, &[&req.prompt, &[tok]])?;
        self.reqs.prefilled(req.id, st, tok);
        Ok(Arrived {
            seconds: t0.elapsed().as_secs_f64(),
            first_token: Some(tok),
        })
    }

    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError> {
        let t0 = Instant::now();
        self.take_arrivals()?;
        let eos = self.cfg.eos_token;
        let plan = self.reqs.plan(rows, eos)?;
        let launch = if self.cfg.cuda_graphs {
            Launch::Graph
        } else {
            Launch::Eager
        };
        let tokens = match self.draft.as_ref().map(DraftDev::rows_per) {
            None => {
                let (out, _) = self.decode_sampled(&plan.run, &plan.samples, launch, false)?;
                self.reqs.finish(plan, &out)?
            }
            Some(per) => {
                // Each draft position is sampled as plain decoding would sample it there.
                let mut samples = Vec::with_capacity(plan.run.len() * per);
                for (r, first) in plan.run.iter().zip(&plan.samples) {
                    let st = self
                        .reqs
                        .get(r.id)
                        .ok_or(BackendError::UnknownRequest(r.id))?;
                    samples.push(*first);
                    let pos = u64::from(r.context_len) + 1;
                    samples.extend((1..per as u32).map(|i| st.sample_row_ahead(pos, i, eos)));
                }
                let out = self.decode_verify(&plan.run, &samples, launch)?;
                self.reqs.finish_rows(plan, out.iter().map(Vec::as_slice))?
            }
        };
        Ok(StepOutput {
            tokens,
            step_s: t0.elapsed().as_secs_f64(),
        })
    }

    fn release(&mut self, id: RequestId) {
        self.reqs.remove(id);
        if let Some(lane) = &self.lane {
            lane.forget(id);
        }
    }

    fn capacity(&self) -> BackendCapacity {
        BackendCapacity {
            kv_pages: self.kv.num_pages.min(u32::MAX as usize) as u32,
            tokens_per_block: self.kv.page_size as u32,
            seq_slots: self.cfg.max_resident as u32,
        }
    }

    fn context_lane(&self) -> Option<Arc<dyn ContextLane>> {
        self.lane
            .as_ref()
            .map(|l| l.clone() as Arc<dyn ContextLane>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_batch_size_up_to_the_max() {
        assert_eq!(
            buckets(128),
            vec![1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128]
        );
        assert_eq!(buckets(1), vec![1]);
        assert_eq!(buckets(20), vec![1, 2, 4, 8, 16, 20]);
        for max in [1usize, 3, 50, 144] {
            let b = buckets(max);
            assert_eq!(*b.last().unwrap(), max);
            assert!(b.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn without_cuda_libraries_new_is_unavailable_not_a_panic() {
        if super::super::probe::LibraryProbe::run().all_present() {
            eprintln!("skipping: CUDA present; the GPU tests cover construction");
            return;
        }
        let cfg = CudaConfig::new(ModelSource::Seeded {
            shape: "tiny".into(),
            seed: 1,
        });
        match CudaBackend::new(cfg) {
            Err(BackendError::Unavailable(m)) => assert!(m.contains("LD_LIBRARY_PATH"), "{m}"),
            Err(e) => panic!("expected Unavailable, got {e}"),
            Ok(_) => panic!("expected Unavailable without CUDA"),
        }
    }
}

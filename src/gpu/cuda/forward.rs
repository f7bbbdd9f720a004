//! One forward pass of the decoder over a set of rows, enqueued on one stream: the decode
//! step (one token per request) and each prefill chunk (one row per prompt token, sharing a
//! page table) run the same sequence of kernels and GEMMs. Buffers are fixed per scratch, so
//! a decode pass can be captured into a CUDA graph. The residual stream `x` is float32 (the o
//! and down GEMMs accumulate into it with a float32 C, or their K-slice parts are added by
//! the next RMSNorm: `StepOptions::o_splits`, `down_splits`); everything a GEMM reads is
//! bf16 (qkv's K-slice parts are summed and rounded by RoPE + KV write: `qkv_splits`).

use super::device::{
    BalancedGrid, DepKernel, DevBuf, DevRange, Gpu, Output, Product, Which, A, TC_TILE,
};
use super::shape::ModelShape;
use super::staging::InputLayout;
use super::step_options::{AttnGrid, StepOptions};
use super::weights::Weights;
use crate::gpu::BackendError;

/// The paged KV cache: per attention layer a K and a V region of `num_pages` pages, each
/// page [kv_heads][tokens_per_block][head_dim] bf16 (a hybrid's recurrent layers have none).
pub(crate) struct KvCache {
    buf: DevBuf,
    pub num_pages: usize,
    pub page_size: usize,
    page_elems: usize,
    layers: usize,
}

impl KvCache {
    pub fn new(
        gpu: &Gpu,
        s: &ModelShape,
        num_pages: usize,
        page_size: usize,
    ) -> Result<Self, BackendError> {
        let page_elems = s.kv_heads * page_size * s.head_dim;
        let layers = s.attention_layers();
        let bytes = 2 * layers * num_pages * page_elems * 2;
        Ok(KvCache {
            buf: gpu.alloc(bytes, Which::Decode)?,
            num_pages,
            page_size,
            page_elems,
            layers,
        })
    }

    /// (base pointer, elements per region, elements per page, regions): region 2l is
    /// attention layer l's K, 2l + 1 its V.
    pub fn geometry(&self) -> (u64, u64, usize, usize) {
        (
            self.buf.ptr,
            (self.num_pages * self.page_elems) as u64,
            self.page_elems,
            2 * self.layers,
        )
    }

    fn region(&self, i: usize) -> u64 {
        self.buf.at(i * self.num_pages * self.page_elems * 2)
    }
    pub fn k(&self, layer: usize) -> u64 {
        self.region(2 * layer)
    }
    pub fn v(&self, layer: usize) -> u64 {
        self.region(2 * layer + 1)
    }
    pub fn bytes(&self) -> usize {
        self.buf.bytes
    }
    /// Fills every page with seeded values (benchmarks need non-zero KV).
    pub fn fill_random(&self, gpu: &Gpu, seed: u32) -> Result<(), BackendError> {
        gpu.init_uniform(
            Which::Decode,
            self.buf.ptr,
            (self.buf.bytes / 2) as u64,
            seed,
            4000,
            1.0,
            0.0,
        )?;
        gpu.sync(Which::Decode)
    }
}

/// The recurrent states of a hybrid model: one per sequence slot (the recurrent-state pool's
/// index), each [recurrent layer][kv head][head_dim][head_dim] f32 (`pools::recurrent`).
pub(crate) struct StateCache {
    buf: DevBuf,
    /// f32 values of one slot's state.
    pub slot_elems: u64,
    pub slots: usize,
    layer_elems: u64,
}

impl StateCache {
    /// `None` for a model without recurrent layers.
    pub fn new(gpu: &Gpu, s: &ModelShape, slots: usize) -> Result<Option<Self>, BackendError> {
        let bytes = s.recurrent_state_bytes();
        if bytes == 0 {
            return Ok(None);
        }
        let range = crate::pools::recurrent::state_range(slots as u32, bytes);
        Ok(Some(StateCache {
            buf: gpu.alloc(range.start as usize, Which::Decode)?,
            slot_elems: bytes / 4,
            slots,
            layer_elems: s.state_elems_per_layer() as u64,
        }))
    }

    pub fn ptr(&self) -> u64 {
        self.buf.ptr
    }

    /// Offset in f32 values of recurrent layer `state_layer` within a slot's state.
    pub fn layer_offset(&self, state_layer: usize) -> u64 {
        state_layer as u64 * self.layer_elems
    }

    /// Zeroes slot `slot`'s state (a new request takes it), on `w`'s stream.
    pub fn clear(&self, gpu: &Gpu, w: Which, slot: u32) -> Result<(), BackendError> {
        let r = crate::pools::recurrent::state_range(slot, self.slot_elems * 4);
        if slot as usize >= self.slots {
            return Err(BackendError::Failed(format!(
                "recurrent state slot {slot} outside the {} allocated",
                self.slots
            )));
        }
        // The range lies inside `buf` (checked above); the stream orders the write before any
        // later pass on it.
        gpu.zero(w, self.buf.at(r.start as usize), (r.end - r.start) as usize)
    }

    pub fn bytes(&self) -> usize {
        self.buf.bytes
    }
}

/// Fixed activation buffers for up to `rows` rows.
pub(crate) struct Scratch {
    pub rows: usize,
    part_rows_splits: usize,
    /// The per-row inputs, in `input_layout`'s order (one upload: `staging.rs`); `samp`,
    /// `tokens`, `pos`, `lens` and `seg_slot` lie in it.
    pub inputs: DevBuf,
    pub input_layout: InputLayout,
    pub tokens: DevRange,
    pub pos: DevRange,
    pub lens: DevRange,
    pub table: DevBuf,
    x: DevBuf,
    h: DevBuf,
    qkv: DevBuf,
    attn: DevBuf,
    gu: DevBuf,
    act: DevBuf,
    pub logits: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    /// The balanced attention's count of finished pieces a (row, kv head) pair, each left at
    /// zero by the warp that merges the pair (attention_balanced.cu); decode scratch only.
    attn_counts: DevBuf,
    /// A product's K-slice parts (`StepOptions::qkv_splits`, `o_splits`, `down_splits`):
    /// N parts of `parts_rows` x the product's width, f32, in `parts_elems` floats of a
    /// decode scratch (none in a prefill one). One product's parts at a time: each is summed
    /// by the next kernel that reads its output, before the next product writes parts.
    parts: DevBuf,
    parts_rows: usize,
    parts_elems: usize,
    /// One `SampleRow` per logit row.
    pub samp: DevRange,
    pub out_tok: DevBuf,
    /// Recurrent layers' segments (`recurrent.cu`): each one's slot, first row and rows.
    pub seg_slot: DevRange,
    pub seg_row0: DevBuf,
    pub seg_rows: DevBuf,
}

impl Scratch {
    /// `part_rows_splits` bounds rows x splits of any pass run on it; `logit_rows` bounds the
    /// rows whose logits a pass computes.
    pub fn new(
        gpu: &Gpu,
        s: &ModelShape,
        w: Which,
        rows: usize,
        table_width: usize,
        part_rows_splits: usize,
        logit_rows: usize,
    ) -> Result<Self, BackendError> {
        let a = |n: usize| gpu.alloc(n, w);
        let hd = s.heads * s.head_dim;
        // Decode passes only: a prefill chunk's rows are many, and cuBLAS needs no K splits
        // to fill the chip there.
        let o = &gpu.k.opts;
        let (parts_rows, parts_elems) = match w {
            Which::Decode => (
                rows,
                rows * [
                    o.qkv_splits * s.qkv_dim(),
                    o.o_splits * s.hidden,
                    o.down_splits * s.hidden,
                ]
                .into_iter()
                .max()
                .unwrap_or(0),
            ),
            _ => (0, 0),
        };
        let input_layout = InputLayout {
            rows,
            logit_rows: logit_rows.max(1),
        };
        let inputs = a(input_layout.bytes())?;
        let at = |offset: usize| DevRange {
            ptr: inputs.at(offset),
        };
        Ok(Scratch {
            rows,
            part_rows_splits,
            parts: a((parts_elems * 4).max(4))?,
            parts_rows,
            parts_elems,
            tokens: at(input_layout.tokens()),
            pos: at(input_layout.pos()),
            lens: at(input_layout.lens()),
            samp: at(input_layout.samp()),
            seg_slot: at(input_layout.seg_slot()),
            inputs,
            input_layout,
            table: a(rows * table_width * 4)?,
            x: a(rows * s.hidden * 4)?,
            h: a(rows * s.hidden * 2)?,
            qkv: a(rows * s.qkv_dim() * 2)?,
            attn: a(rows * hd * 2)?,
            gu: a(rows * 2 * s.ffn * 2)?,
            act: a(rows * s.ffn * 2)?,
            logits: a(logit_rows * s.vocab * 4)?,
            part_o: a(part_rows_splits * hd * 4)?,
            part_ml: a(part_rows_splits * s.heads * 2 * 4)?,
            attn_counts: a(match w {
                Which::Decode if o.attn_grid != AttnGrid::Split => rows * s.kv_heads * 4,
                _ => 4,
            })?,
            out_tok: a(logit_rows.max(1) * 4)?,
            seg_row0: a(rows * 4)?,
            seg_rows: a(rows * 4)?,
        })
    }

    /// Decode segments: row r alone is segment r (its slot is written per step).
    pub fn one_segment_per_row(&self, gpu: &Gpu, w: Which) -> Result<(), BackendError> {
        let row0: Vec<i32> = (0..self.rows as i32).collect();
        gpu.htod(w, self.seg_row0.ptr, &row0)?;
        gpu.htod(w, self.seg_rows.ptr, &vec![1i32; self.rows])?;
        gpu.htod(w, self.seg_slot.ptr, &vec![-1i32; self.rows])?;
        gpu.sync(w)
    }
}

/// The shape of one pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass {
    pub rows: usize,
    /// Attention splits per (row, kv head).
    pub splits: usize,
    /// Page-table row stride in entries; 0 when all rows share row 0 (prefill).
    pub table_stride: usize,
    /// Rows [logits_row0, logits_row0 + logits_rows) get logits and a sampled token (by the
    /// scratch's `samp` rows).
    pub logits_row0: usize,
    pub logits_rows: usize,
    /// Segments of the recurrent layers (the scratch's `seg_*`): `rows` in a decode step,
    /// one in a prefill chunk.
    pub segments: usize,
    /// Each row writes only its own last position's K and V in this pass, and no kernel of
    /// the pass writes `lens` or the page table (a plain decode step; not a prefill chunk,
    /// whose rows read each other's new positions, nor a verify pass, whose lookup writes
    /// the table): attention may copy the rest before its predecessor ends
    /// (`StepOptions::early_kv`).
    pub kv_settled: bool,
    /// The balanced attention grid may take this pass (`StepOptions::attn_grid`; it takes a
    /// decode pass of one split a row, `balanced_launch`).
    pub balanced: bool,
}

/// The balanced attention's kernel and grid for pass `p`, when it takes the pass
/// (`Pass::balanced`, as `StepOptions::attn_grid` chose): a decode pass (each row its own
/// page-table row) of one split a row, over pages of whole 16-token tiles, on a scratch with
/// a counter for each (row, kv head) and a partial slot for each piece.
fn balanced_launch<'g>(
    gpu: &'g Gpu,
    s: &ModelShape,
    kv: &KvCache,
    sc: &Scratch,
    p: Pass,
) -> Result<Option<(&'g DepKernel, BalancedGrid)>, BackendError> {
    let Some(f) = &gpu.k.attn_balanced else {
        return Ok(None);
    };
    if !p.balanced || p.splits != 1 || p.table_stride == 0 || !kv.page_size.is_multiple_of(TC_TILE)
    {
        return Ok(None);
    }
    let Some(g) = gpu.balanced_grid(p.rows, s.head_dim)? else {
        return Ok(None);
    };
    // Slots: one a pair, and one more for each cut between warps.
    let slots = p.rows * s.kv_heads + g.warps;
    if sc.attn_counts.bytes < p.rows * s.kv_heads * 4 || sc.part_rows_splits * s.kv_heads < slots {
        return Err(BackendError::Failed(format!(
            "balanced attention over {} rows needs {slots} partial slots and a counter a \
             (row, kv head); the scratch has {} slots and {} counters",
            p.rows,
            sc.part_rows_splits * s.kv_heads,
            sc.attn_counts.bytes / 4
        )));
    }
    Ok(Some((f, g)))
}

/// Threads of the RMSNorm block for a row of `hidden`: a float4 a thread where it fits
/// (`RMS_VEC` in layers.cu lets a thread hold up to four).
pub(crate) fn rms_threads(hidden: usize) -> u32 {
    (hidden.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32
}

const ROPE_THREADS: u32 = 256;

/// Blocks per row of `rope_kv_write`: one thread per rotated pair of q and k and per element
/// of v.
fn rope_blocks(s: &ModelShape) -> u32 {
    let items = (s.heads + s.kv_heads) * s.head_dim / 2 + s.kv_heads * s.head_dim;
    items.div_ceil(ROPE_THREADS as usize) as u32
}

/// Attention splits for a pass of `rows` rows: about `blocks_per_sm` blocks per
/// multiprocessor (`StepOptions`, 8 by default), so loads of some blocks overlap the
/// arithmetic of others. The kernel gives each split at least 256 tokens, so short contexts
/// leave the extra splits idle.
pub(crate) fn splits_for(
    rows: usize,
    kv_heads: usize,
    sm_count: u32,
    blocks_per_sm: usize,
) -> usize {
    (blocks_per_sm * sm_count as usize)
        .div_ceil(kv_heads * rows.max(1))
        .clamp(1, MAX_SPLITS)
}

/// Whether a decode pass of one attention split a row over rows of `lens` tokens should run on
/// the balanced grid (`AttnGrid::Auto`). The split grid runs a block per (row, kv head) in
/// waves over `blocks_per_sm × sm_count` slots, the longest rows first; each slot then
/// streams about `Σ lens × kv_heads / slots` tokens, and when the longest row's block alone
/// holds more, the kernel's end waits on it while the other slots idle. The balanced grid
/// gives every warp an equal run of tiles but streams more slowly, so it takes only the
/// passes where that wait costs more than its slower stream: see [`BALANCED_ABOVE`].
pub(crate) fn uneven_rows(
    lens: impl IntoIterator<Item = usize>,
    kv_heads: usize,
    sm_count: u32,
    blocks_per_sm: usize,
) -> bool {
    let slots = (blocks_per_sm * sm_count as usize).max(1);
    let (longest, total) = lens.into_iter().fold((0, 0), |(longest, total), len| {
        (longest.max(len), total + len)
    });
    // longest > BALANCED_ABOVE × total × kv_heads / slots, in integers.
    let (num, den) = BALANCED_ABOVE;
    longest * slots * den > total * kv_heads * num
}

/// The longest block's tokens over the mean slot's above which `uneven_rows` takes the
/// balanced grid: 5/4. Measured on the H100 as whole decode steps (BENCHMARKS.md §3.26–3.28),
/// the split grid's step against the balanced grid's is −2.9 to −3.2 % (batch 64) and −2.3 to
/// −2.9 % (batch 128) on rows whose ratio is at most 1 (where no block outlasts the waves;
/// rows of one length sit at 0.52 and 0.26) and rises about 10–12 % per unit of ratio above
/// it (batch 64: +1.1 % at 1.42, +5.1 % at 1.78, +8.9 % at 2.20, +20.6 % at 3.16; batch 128:
/// −1.4 % at 1.13, +0.4 % at 1.26, +4.6 % at 1.67), so the two grids cost the same at 1.23
/// (batch 128) to 1.31 (batch 64); with this line `auto` ran the faster grid at every one of
/// §3.28's points. `tools/gpu/batch_mix.py` counts a recording's steps above it with the same
/// value.
pub(crate) const BALANCED_ABOVE: (usize, usize) = (5, 4);

/// The split count of every decode pass in batch-invariant mode (`StepOptions::
/// batch_invariant`): enough 256-token splits for a row of `max_context` tokens, at most
/// `MAX_SPLITS`. With one count for every batch, where a row's splits begin and end
/// (`live_splits`) depends on its own length only, and so does the order of its sums.
pub(crate) fn invariant_splits(max_context: usize) -> usize {
    max_context.div_ceil(ATTN_MIN_CHUNK).clamp(1, MAX_SPLITS)
}

/// How many of `splits` splits get tokens of a row of `len` tokens (`live_splits` in
/// attention.cu): each split takes whole 64-token tiles and at least 256 tokens.
pub(crate) fn live_splits(len: usize, splits: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let chunk = len
        .div_ceil(splits.max(1))
        .max(ATTN_MIN_CHUNK)
        .div_ceil(ATTN_TILE)
        * ATTN_TILE;
    splits.min(len.div_ceil(chunk))
}

/// `ATTN_TILE` and `ATTN_MIN_CHUNK` of attention.cu (a test checks).
const ATTN_TILE: usize = 64;
const ATTN_MIN_CHUNK: usize = 256;

/// The most attention splits of a row (`COMBINE_MAX_SPLITS` in attention.cu).
pub(crate) const MAX_SPLITS: usize = 128;

/// Enqueues the pass on `w`'s stream. Inputs (tokens, pos, lens, table, samp) must already
/// be in the scratch; outputs are `logits` and `out_tok` of the logit rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn enqueue(
    gpu: &Gpu,
    w: Which,
    s: &ModelShape,
    wt: &Weights,
    kv: &KvCache,
    states: Option<&StateCache>,
    sc: &Scratch,
    p: Pass,
) -> Result<(), BackendError> {
    if p.rows == 0 || p.rows > sc.rows || p.rows * p.splits > sc.part_rows_splits {
        return Err(BackendError::Failed(format!(
            "pass of {} rows x {} splits exceeds scratch of {} rows",
            p.rows, p.splits, sc.rows
        )));
    }
    let r = p.rows as u32;
    let hid = s.hidden;
    let k = &gpu.k;
    gpu.launch(
        w,
        &k.embed,
        (r, 1, 1),
        128,
        &[
            A::P(wt.embed),
            A::P(sc.tokens.ptr),
            A::P(sc.x.ptr),
            A::I(hid as i32),
            A::I(s.vocab as i32),
        ],
    )?;
    let attn_fn = &k.attn;
    let balanced = balanced_launch(gpu, s, kv, sc, p)?;
    // The attention kernel writes `attn` itself, with no `attn_combine`: the balanced grid
    // always, the split grid with one split (`StepOptions::direct_single_split`).
    let direct = balanced.is_some() || (k.opts.direct_single_split && p.splits == 1);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    // down_proj's parts not yet added into the residual (the next RMSNorm adds them).
    let mut parts = 0;
    for (l, lw) in wt.layers.iter().enumerate() {
        rmsnorm(gpu, w, s, sc, parts, lw.attn_norm, 0, p.rows)?;
        let qkv = Product {
            weight: lw.qkv,
            out: s.qkv_dim(),
            inp: hid,
            rows: p.rows,
            x: sc.h.ptr,
            y: sc.qkv.ptr,
            output: Output::Bf16,
        };
        if let (Some(sl), Some(st)) = (s.state_layer(l), states) {
            gpu.gemm(w, &qkv)?;
            recurrent(gpu, w, s, lw, st, sl, sc, p)?;
            parts = mlp(gpu, w, s, lw, sc, p)?;
            continue;
        }
        let Some(kl) = s.kv_layer(l) else {
            return Err(BackendError::Failed(format!(
                "layer {l} is recurrent and the backend holds no recurrent states"
            )));
        };
        // RoPE + KV write reads q|k|v from the parts when there are some.
        let qkv_parts = product(gpu, w, sc, &qkv, k.opts.qkv_splits)?;
        gpu.launch_dep(
            w,
            &k.rope_kv,
            (r, rope_blocks(s), 1),
            ROPE_THREADS,
            0,
            &[
                A::P(sc.qkv.ptr),
                A::P(parts_ptr(sc, qkv_parts, 0)),
                A::I(qkv_parts as i32),
                A::L((sc.parts_rows * s.qkv_dim()) as u64),
                A::P(sc.pos.ptr),
                A::P(sc.lens.ptr),
                A::P(sc.table.ptr),
                A::I(p.table_stride as i32),
                A::P(kv.k(kl)),
                A::P(kv.v(kl)),
                A::I(s.heads as i32),
                A::I(s.kv_heads as i32),
                A::I(s.head_dim as i32),
                A::I(kv.page_size as i32),
                A::P(wt.inv_freq),
            ],
        )?;
        // What both attention kernels take first: q, K, V, lengths, page table, the cache's
        // shape.
        let inputs = [
            A::P(sc.qkv.ptr),
            A::I(s.qkv_dim() as i32),
            A::P(kv.k(kl)),
            A::P(kv.v(kl)),
            A::P(sc.lens.ptr),
            A::P(sc.table.ptr),
            A::I(p.table_stride as i32),
            A::I(s.kv_heads as i32),
            A::I(kv.page_size as i32),
        ];
        let early = A::I((p.kv_settled && k.opts.early_kv) as i32);
        match balanced {
            Some((f, g)) => {
                let rest = [
                    A::I(p.rows as i32),
                    A::F(scale),
                    A::P(sc.part_o.ptr),
                    A::P(sc.part_ml.ptr),
                    A::P(sc.attn_counts.ptr),
                    A::P(sc.attn.ptr),
                    early,
                ];
                let args = [&inputs[..], &rest].concat();
                gpu.launch_dep(w, f, (g.blocks, 1, 1), g.threads, g.smem, &args)?;
            }
            None => {
                let rest = [
                    A::I(p.splits as i32),
                    A::F(scale),
                    A::P(sc.part_o.ptr),
                    A::P(sc.part_ml.ptr),
                    A::P(if direct { sc.attn.ptr } else { 0 }),
                    early,
                ];
                let args = [&inputs[..], &rest].concat();
                gpu.launch_dep(
                    w,
                    attn_fn,
                    (s.kv_heads as u32, r, p.splits as u32),
                    k.opts.attn.threads(k.opts.attn_ring),
                    k.opts.attn.smem_bytes(s.head_dim, k.opts.attn_ring),
                    &args,
                )?;
            }
        }
        if !direct {
            gpu.launch_dep(
                w,
                &k.combine,
                (s.heads as u32, r, 1),
                s.head_dim as u32,
                0,
                &[
                    A::P(sc.part_o.ptr),
                    A::P(sc.part_ml.ptr),
                    A::P(sc.lens.ptr),
                    A::P(sc.attn.ptr),
                    A::I(s.heads as i32),
                    A::I(s.head_dim as i32),
                    A::I(p.splits as i32),
                ],
            )?;
        }
        parts = mlp(gpu, w, s, lw, sc, p)?;
    }
    if p.logits_rows > 0 {
        let h0 = sc.h.at(p.logits_row0 * hid * 2);
        // With parts pending every row takes them (the residual is whole again) and is
        // normed; otherwise only the rows that get logits.
        let (row0, rows) = match parts {
            0 => (p.logits_row0, p.logits_rows),
            _ => (0, p.rows),
        };
        rmsnorm(gpu, w, s, sc, parts, wt.final_norm, row0, rows)?;
        let lm_head = Product {
            weight: wt.lm_head,
            out: s.vocab,
            inp: hid,
            rows: p.logits_rows,
            x: h0,
            y: sc.logits.ptr,
            output: Output::F32,
        };
        gpu.gemm(w, &lm_head)?;
        gpu.sample_rows(
            w,
            sc.logits.ptr,
            s.vocab,
            sc.samp.ptr,
            sc.out_tok.ptr,
            p.logits_rows,
        )?;
    }
    Ok(())
}

/// RMSNorm of the scratch's float32 residual rows `row0..row0 + rows` with `weight`, into
/// the same bf16 rows of `h`, after adding the `parts` parts of the product before it (o_proj
/// or down_proj) into them (none: 0).
#[allow(clippy::too_many_arguments)]
fn rmsnorm(
    gpu: &Gpu,
    w: Which,
    s: &ModelShape,
    sc: &Scratch,
    parts: usize,
    weight: u64,
    row0: usize,
    rows: usize,
) -> Result<(), BackendError> {
    let hid = s.hidden;
    gpu.launch_dep(
        w,
        &gpu.k.rmsnorm,
        (rows as u32, 1, 1),
        rms_threads(hid),
        0,
        &[
            A::P(sc.x.at(row0 * hid * 4)),
            // Read only with parts to add (a prefill scratch has none).
            A::P(parts_ptr(sc, parts, row0 * hid * 4)),
            A::I(parts as i32),
            A::L((sc.parts_rows * hid) as u64),
            A::P(weight),
            A::P(sc.h.at(row0 * hid * 2)),
            A::I(hid as i32),
            A::F(s.rms_eps),
        ],
    )
}

/// The rest of a layer after its token mixer wrote `attn`: o_proj into the residual, then
/// RMSNorm and the SwiGLU MLP. Returns how many parts down_proj left for the next RMSNorm
/// to add into the residual (`StepOptions::down_splits`), 0 when it added its own.
fn mlp(
    gpu: &Gpu,
    w: Which,
    s: &ModelShape,
    lw: &super::weights::LayerPtrs,
    sc: &Scratch,
    p: Pass,
) -> Result<usize, BackendError> {
    let k = &gpu.k;
    let r = p.rows as u32;
    let (hid, hdim) = (s.hidden, s.heads * s.head_dim);
    let o = Product {
        weight: lw.o,
        out: hid,
        inp: hdim,
        rows: p.rows,
        x: sc.attn.ptr,
        y: sc.x.ptr,
        output: Output::AddF32,
    };
    let o_parts = product(gpu, w, sc, &o, k.opts.o_splits)?;
    rmsnorm(gpu, w, s, sc, o_parts, lw.ffn_norm, 0, p.rows)?;
    let gate_up = Product {
        weight: lw.gate_up,
        out: 2 * s.ffn,
        inp: hid,
        rows: p.rows,
        x: sc.h.ptr,
        y: sc.gu.ptr,
        output: Output::Bf16,
    };
    gpu.gemm(w, &gate_up)?;
    // Eight elements a thread (silu_mul in layers.cu; ffn is a multiple of 8).
    let gx = s.ffn.div_ceil(8 * 256).min(64) as u32;
    gpu.launch_dep(
        w,
        &k.silu_mul,
        (gx, r, 1),
        256,
        0,
        &[A::P(sc.gu.ptr), A::P(sc.act.ptr), A::I(s.ffn as i32)],
    )?;
    let down = Product {
        weight: lw.down,
        out: hid,
        inp: s.ffn,
        rows: p.rows,
        x: sc.act.ptr,
        y: sc.x.ptr,
        output: Output::AddF32,
    };
    product(gpu, w, sc, &down, k.opts.down_splits)
}

/// Enqueues `p`, in `n` K slices into the scratch's parts where `k_slices` allows, else as
/// asked. Returns how many parts the next kernel must sum in place of `p`'s output (0: none).
fn product(
    gpu: &Gpu,
    w: Which,
    sc: &Scratch,
    p: &Product,
    n: usize,
) -> Result<usize, BackendError> {
    let n = k_slices(&gpu.k.opts, n, p, sc.parts_rows, sc.parts_elems);
    if n == 0 {
        gpu.gemm(w, p)?;
        return Ok(0);
    }
    let sliced = Product {
        y: sc.parts.ptr,
        output: Output::F32,
        ..*p
    };
    gpu.gemm_parts(w, &sliced, n, sc.parts_rows)?;
    Ok(n)
}

/// The parts' address, `offset` bytes in, for a kernel that sums `n` of them (0 when it sums
/// none).
fn parts_ptr(sc: &Scratch, n: usize, offset: usize) -> u64 {
    match n {
        0 => 0,
        _ => sc.parts.at(offset),
    }
}

/// How many K slices `p` runs as when `n` are asked for (`StepOptions::qkv_splits`,
/// `o_splits`, `down_splits`), 0 for the plain product: rows the GEMV takes, a
/// batch-invariant launch, a K the count does not divide, or a scratch without room for
/// the parts (`parts_elems` floats, `parts_rows` rows a part) keep it.
fn k_slices(
    o: &StepOptions,
    n: usize,
    p: &Product,
    parts_rows: usize,
    parts_elems: usize,
) -> usize {
    let plain = n == 0
        || o.batch_invariant
        || p.rows <= o.gemv_rows
        || p.rows > parts_rows
        || n * parts_rows * p.out > parts_elems
        || !p.inp.is_multiple_of(n);
    if plain {
        0
    } else {
        n
    }
}

/// A recurrent layer's mixer: the scan over each segment's rows, reading q|k|v and the normed
/// input, updating the segment's state in place, writing `attn`.
#[allow(clippy::too_many_arguments)]
fn recurrent(
    gpu: &Gpu,
    w: Which,
    s: &ModelShape,
    lw: &super::weights::LayerPtrs,
    st: &StateCache,
    state_layer: usize,
    sc: &Scratch,
    p: Pass,
) -> Result<(), BackendError> {
    if p.segments == 0 || p.segments > sc.rows {
        return Err(BackendError::Failed(format!(
            "{} recurrent segments for a scratch of {} rows",
            p.segments, sc.rows
        )));
    }
    gpu.launch(
        w,
        &gpu.k.recurrent,
        (s.kv_heads as u32, p.segments as u32, 1),
        s.head_dim as u32,
        &[
            A::P(sc.qkv.ptr),
            A::P(sc.h.ptr),
            A::P(lw.decay),
            A::P(lw.decay_bias),
            A::P(st.ptr()),
            A::L(st.slot_elems),
            A::L(st.layer_offset(state_layer)),
            A::P(sc.seg_slot.ptr),
            A::P(sc.seg_row0.ptr),
            A::P(sc.seg_rows.ptr),
            A::P(sc.lens.ptr),
            A::P(sc.attn.ptr),
            A::I(s.heads as i32),
            A::I(s.kv_heads as i32),
            A::I(s.hidden as i32),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_run_in_k_slices_only_where_the_option_and_the_scratch_allow() {
        let o = StepOptions::default();
        // llama-8b's down_proj at 64 rows, on a decode scratch of 128 rows with room for 4
        // parts of hidden 4096.
        let down = |rows| Product {
            weight: 0,
            out: 4096,
            inp: 14_336,
            rows,
            x: 0,
            y: 0,
            output: Output::AddF32,
        };
        let room = 4 * 128 * 4096;
        assert_eq!(k_slices(&o, 4, &down(64), 128, room), 4);
        // Not asked, one row (the GEMV's), more rows than the scratch holds, no room for the
        // parts (a prefill scratch, or a wider product), a K the count does not divide: the
        // plain product.
        assert_eq!(k_slices(&o, 0, &down(64), 128, room), 0);
        assert_eq!(k_slices(&o, 4, &down(1), 128, room), 0);
        assert_eq!(k_slices(&o, 4, &down(129), 128, room), 0);
        assert_eq!(k_slices(&o, 4, &down(64), 0, 0), 0);
        assert_eq!(k_slices(&o, 8, &down(64), 128, room), 0);
        let qkv = Product {
            out: 6144,
            inp: 4096,
            ..down(64)
        };
        assert_eq!(k_slices(&o, 4, &qkv, 128, room), 0);
        assert_eq!(k_slices(&o, 2, &qkv, 128, room), 2);
        assert_eq!(k_slices(&o, 3, &down(64), 128, room), 0);
        // Without the GEMV a single row takes parts too; a batch-invariant launch never does.
        let no_gemv = StepOptions { gemv_rows: 0, ..o };
        assert_eq!(k_slices(&no_gemv, 4, &down(1), 128, room), 4);
        let invariant = StepOptions {
            batch_invariant: true,
            ..no_gemv
        };
        assert_eq!(k_slices(&invariant, 4, &down(64), 128, room), 0);
    }

    #[test]
    fn rmsnorm_blocks_hold_the_row_in_registers_up_to_16k_hidden() {
        // layers.cu keeps up to RMS_VEC = 4 float4s a thread; beyond that it loops.
        for hidden in [256, 576, 2048, 4096, 8192, 16384] {
            let t = rms_threads(hidden) as usize;
            assert_eq!(t % 32, 0);
            assert!(t * 4 * 4 >= hidden, "{hidden}: {t} threads");
            assert!(t <= 1024);
        }
        assert_eq!(rms_threads(4096), 1024);
        assert_eq!(rms_threads(256), 64);
    }

    #[test]
    fn a_split_takes_whole_tiles_and_at_least_256_tokens() {
        let src = include_str!("kernels/attention.cu");
        assert!(src.contains(&format!("#define ATTN_TILE {ATTN_TILE}\n")));
        assert!(src.contains(&format!("#define ATTN_MIN_CHUNK {ATTN_MIN_CHUNK}\n")));
        assert_eq!(live_splits(0, 16), 0);
        assert_eq!(live_splits(4097, 1), 1);
        // 16 splits of 4097 tokens: 320-token chunks (257 rounded up to tiles), 13 live.
        assert_eq!(live_splits(4097, 16), 13);
        assert_eq!(live_splits(4096, 16), 16);
        assert_eq!(live_splits(300, 33), 2);
        assert_eq!(live_splits(32769, 32), 31);
    }

    /// The balanced grid takes a pass when the longest row's block holds more than 5/4 of
    /// the tokens a slot of the split grid streams on average (BENCHMARKS.md §3.26–3.27).
    #[test]
    fn uneven_rows_are_those_whose_longest_block_outlasts_the_mean_slot_by_a_quarter() {
        // An H100's 132 SMs at 2 blocks each, llama-8b's 8 kv heads.
        let uneven = |lens: &[usize]| uneven_rows(lens.iter().copied(), 8, 132, 2);
        // 128 rows of one length: a slot streams 3.9 rows' worth.
        assert!(!uneven(&[1773; 128]));
        // At batch 128 the edge is one row of 5,001 tokens among rows of 1,000: its block
        // against 5/4 of (127,000 + 5,001) × 8 / 264 tokens a slot.
        let mut lens = vec![1000; 127];
        lens.push(5000);
        assert!(!uneven(&lens));
        lens[127] = 5001;
        assert!(uneven(&lens));
        // Past the mean slot but not by a quarter: the split grid's wait costs less than the
        // balanced grid's slower stream.
        lens[127] = 4500;
        assert!(!uneven(&lens));
        // At batch 64 a slot streams 1.9 rows' worth: a row of 2x the mean is even enough,
        // one of 2.6x is not.
        let mut lens = vec![1000; 63];
        lens.push(2000);
        assert!(!uneven(&lens));
        lens[63] = 2480;
        assert!(!uneven(&lens));
        lens[63] = 2481;
        assert!(uneven(&lens));
        // Fewer (row, kv head) pairs than slots: any row's block outlasts the mean slot, but
        // such a pass runs several splits a row, which the balanced grid never takes.
        assert!(uneven(&[100; 16]));
        assert!(!uneven(&[]));
    }

    /// BENCHMARKS.md §3.28 benched two typical served steps' mixes on both grids: the
    /// balanced grid was faster for both at batch 64 and for the seven-minute window's (T8)
    /// at 128, the split grid for the three-minute window's (T3) at 128 and for rows of one
    /// length. The line puts each of them on its faster grid's side.
    #[test]
    fn the_line_sends_each_benched_served_mix_to_the_grid_that_ran_it_faster() {
        const T3: [f64; 21] = [
            0.10, 0.20, 0.28, 0.34, 0.39, 0.45, 0.50, 0.55, 0.60, 0.65, 0.72, 0.81, 0.91, 1.04,
            1.14, 1.22, 1.37, 1.60, 1.95, 2.80, 4.49,
        ];
        const T8: [f64; 21] = [
            0.10, 0.21, 0.29, 0.34, 0.40, 0.46, 0.51, 0.56, 0.62, 0.67, 0.74, 0.82, 0.91, 1.05,
            1.15, 1.26, 1.40, 1.58, 1.90, 2.67, 5.11,
        ];
        // The bench's rows at 1,773 tokens; the step attends over each row's context and
        // its new token, as `balanced_for` counts them.
        let balanced = |ratios: &[f64], rows: usize| {
            let lens = crate::gpu::cuda::bench::ratio_contexts(1773, rows, ratios);
            uneven_rows(lens.into_iter().map(|l| l + 1), 8, 132, 2)
        };
        assert!(balanced(&T3, 64));
        assert!(balanced(&T8, 64));
        assert!(!balanced(&T3, 128));
        assert!(balanced(&T8, 128));
        assert!(!uneven_rows([1774; 64], 8, 132, 2));
        assert!(!uneven_rows([1774; 128], 8, 132, 2));
    }

    #[test]
    fn batch_invariant_splits_cut_a_row_by_its_length_alone() {
        let s = invariant_splits(4096);
        assert_eq!(s, 16);
        // Every row up to max_context gets 256-token splits, one per started 256 tokens.
        for len in [1, 255, 256, 257, 1000, 4095, 4096] {
            assert_eq!(live_splits(len, s), len.div_ceil(256), "{len}");
        }
        assert_eq!(invariant_splits(100), 1);
        assert_eq!(invariant_splits(33 * 1024), MAX_SPLITS);
    }

    #[test]
    fn the_split_cap_matches_the_combine_kernels_shared_memory() {
        let src = include_str!("kernels/attention.cu");
        assert!(src.contains(&format!("#define COMBINE_MAX_SPLITS {MAX_SPLITS}\n")));
    }

    #[test]
    fn splits_fill_the_chip_for_small_batches_and_stay_bounded() {
        // 132 multiprocessors, 8 kv heads: one row needs 132 splits for ~8 blocks per SM,
        // capped at 128; 128 rows already give 1024 blocks with 2 splits.
        assert_eq!(splits_for(1, 8, 132, 8), 128);
        assert_eq!(splits_for(32, 8, 132, 8), 5);
        assert_eq!(splits_for(128, 8, 132, 8), 2);
        assert_eq!(splits_for(4096, 8, 132, 8), 1);
        // Two blocks per SM (what the tensor-core kernel's shared memory lets reside): from
        // batch 33 on a row's context is one split.
        assert_eq!(splits_for(1, 8, 132, 2), 33);
        assert_eq!(splits_for(32, 8, 132, 2), 2);
        assert_eq!(splits_for(33, 8, 132, 2), 1);
        assert_eq!(splits_for(128, 8, 132, 2), 1);
        for rows in 1..300 {
            let s = splits_for(rows, 8, 132, 8);
            assert!((1..=128).contains(&s));
            assert!(
                s == 128 || s == 1 || rows * 8 * s >= 8 * 132,
                "rows {rows}: {s}"
            );
        }
    }
}

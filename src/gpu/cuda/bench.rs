//! The decode benchmark behind `genslot-gpu bench`: step time per (batch, context) with
//! graph replay and eager launches, the copy bandwidth measured in the same run, the HBM
//! roofline of each step, the step with every row sampled next to greedy, the step with
//! requests paused in place next to none paused, and whether a request's logits depend on
//! the batch it runs in.

use std::time::Instant;

use cudarc::driver::sys;
use serde::Serialize;

use super::backend::{CudaBackend, Launch};
use super::device::{drv, Which};
use super::forward::live_splits;
use crate::gpu::{BackendError, StepRow};
use crate::sampling::{row_key, SampleRow};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub batches: Vec<usize>,
    pub contexts: Vec<usize>,
    /// Timed steps per measurement (the median is reported).
    pub iters: usize,
    pub warmup: usize,
    /// Bytes copied (and as many written) by the bandwidth probe.
    pub copy_bytes: usize,
    /// (batch, context, paused) of the pause comparison.
    pub paused: (usize, usize, usize),
    /// After timing each point, one more eager step between cuProfilerStart and
    /// cuProfilerStop: `ncu --profile-from-start off` then sees exactly one step per point.
    pub profile: bool,
    /// The sampling of `sampled_ms` (its `key` is each row's own).
    pub sampling: SampleRow,
    /// 0: every row of a step at the point's context. F > 0: the rows' contexts spread
    /// evenly over context × [1 − F, 1 + F] in a shuffled order (`spread_contexts`), the same
    /// KV bytes a step, as a served batch mixes short and long requests.
    pub context_spread: f64,
    /// Non-empty: the rows' contexts follow these ratios to the point's context instead
    /// (`ratio_contexts`), a served batch's mix of lengths; `context_spread` is then unused.
    pub context_ratios: Vec<f64>,
}

impl BenchOptions {
    /// The rows' contexts of a step at the point (`ctx`, `batch`): `ratio_contexts` where
    /// ratios are given, else `spread_contexts`.
    pub fn row_contexts(&self, ctx: usize, batch: usize) -> Vec<usize> {
        if self.context_ratios.is_empty() {
            spread_contexts(ctx, batch, self.context_spread)
        } else {
            ratio_contexts(ctx, batch, &self.context_ratios)
        }
    }

    /// The longest context any step of these options holds, the pause comparison's
    /// included: what the backend's `max_context` must cover.
    pub fn longest_context(&self) -> usize {
        let ctx = self.contexts.iter().copied().max().unwrap_or(0);
        let row = if self.context_ratios.is_empty() {
            (ctx as f64 * (1.0 + self.context_spread)).ceil() as usize
        } else {
            self.batches
                .iter()
                .flat_map(|&n| self.row_contexts(ctx, n))
                .max()
                .unwrap_or(ctx)
        };
        row.max(self.paused.1)
    }
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            batches: vec![1, 32, 64, 128],
            contexts: vec![4096, 32768],
            iters: 20,
            warmup: 3,
            copy_bytes: 4 << 30,
            paused: (64, 4096, 48),
            profile: false,
            sampling: SAMPLED,
            context_spread: 0.0,
            context_ratios: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StepRowResult {
    pub batch: usize,
    /// The rows' mean context (each row's with `BenchOptions::context_spread`).
    pub context: usize,
    /// Wall time of a step through `decode` (input copies, graph replay, token read-back).
    pub graph_ms: f64,
    /// Device time of the graph replay alone (events around it): graph_ms less the host's
    /// share of the step.
    pub graph_device_ms: f64,
    /// Wall and device time of an eager step (the same kernels launched one by one), timed
    /// in turn with graph steps after graph_ms was measured.
    pub eager_ms: f64,
    pub eager_device_ms: f64,
    /// eager_ms over the wall time of the graph steps it alternated with.
    pub eager_over_graph: f64,
    /// Wall time of a graph step whose every row is sampled (`BenchOptions::sampling`, by
    /// default [`SAMPLED`]: temperature, top-k and top-p), timed in turn with greedy graph
    /// steps.
    pub sampled_ms: f64,
    /// sampled_ms over the wall time of the greedy steps it alternated with.
    pub sampled_over_greedy: f64,
    /// Weight bytes + KV bytes one step must read.
    pub bytes_read: u64,
    pub roofline_ms: f64,
    /// graph_ms / roofline_ms.
    pub over_roofline: f64,
    /// Page tables wrap around the cache because B x context does not fit in memory (rows
    /// then share physical pages; bytes read per step are unchanged).
    pub pages_aliased: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PauseResult {
    pub batch: usize,
    pub context: usize,
    pub paused: usize,
    pub none_paused_ms: f64,
    pub with_paused_ms: f64,
}

/// Row 0's logits in a step of `batch` rows against the same row alone (same cache, token
/// and position): a paused request resumes in a batch of another size, so its tokens equal
/// an unpaused run's only where these are bit-identical.
#[derive(Debug, Clone, Serialize)]
pub struct InvarianceRow {
    pub batch: usize,
    pub context: usize,
    /// Attention splits of row 0 that get tokens at this batch size (`forward::live_splits`).
    pub splits: usize,
    pub bit_identical: bool,
    pub max_abs_diff: f64,
    /// Greedy token of row 0 equal to the one alone.
    pub same_token: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub shape: String,
    /// `StepOptions::describe` of the backend.
    pub launch: String,
    /// The sampling of `sampled_ms`, in words.
    pub sampling: String,
    pub weight_bytes: usize,
    pub kv_pages: usize,
    pub tokens_per_block: usize,
    pub copy_bandwidth_gbs: f64,
    /// Bytes read per second by a plain streaming read of the KV cache (`read_probe`): the
    /// read-only ceiling beside the copy's read+write one the roofline uses.
    pub read_bandwidth_gbs: f64,
    /// (chunk bytes, GB/s) of the same read in scattered chunks, as paged attention reads.
    pub read_chunks_gbs: Vec<(usize, f64)>,
    /// `BenchOptions::context_spread` of `steps`.
    pub context_spread: f64,
    /// `BenchOptions::context_ratios` of `steps` (empty: not used).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub context_ratios: Vec<f64>,
    pub steps: Vec<StepRowResult>,
    pub pause: PauseResult,
    /// At the first context; batch 1 is the reference.
    pub invariance: Vec<InvarianceRow>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Device-to-device copy inside the KV cache, timed with events; GB/s of bytes read plus
/// written (median of 10).
pub fn copy_bandwidth(b: &CudaBackend, bytes: usize) -> Result<f64, BackendError> {
    let kv = b.kv_cache();
    let bytes = bytes.min(kv.bytes() / 2);
    let (src, dst) = (kv.k(0), kv.k(0) + bytes as u64);
    let ms = timed(b, |_, s| {
        // SAFETY: both ranges lie inside the KV allocation and do not overlap.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, s.cu_stream()) }
            .map_err(drv("device copy"))
    })?;
    Ok(2.0 * bytes as f64 / (ms * 1e-3) / 1e9)
}

/// A streaming read of the KV cache (`read_probe`: at most `bytes`, the largest power of two
/// that fits), in address order (`chunk` 0) or in scattered chunks of `chunk` bytes, timed
/// with events; GB/s of bytes read (median of 10).
pub fn read_bandwidth(b: &CudaBackend, bytes: usize, chunk: usize) -> Result<f64, BackendError> {
    let kv = b.kv_cache();
    let cap = bytes.min(kv.bytes() / 2).max(16);
    let bytes = 1usize << (usize::BITS - 1 - cap.leading_zeros());
    // The cache's upper end, past the copy's range, so the copy's last writes are not what
    // the read finds in L2.
    let src = kv.k(0) + (kv.bytes() - bytes) as u64;
    let sink = b.probe_sink();
    let ms = timed(b, |gpu, _| {
        gpu.read_probe(Which::Decode, src, bytes, chunk, sink)
    })?;
    Ok(bytes as f64 / (ms * 1e-3) / 1e9)
}

/// Median milliseconds of `f` on the decode stream over 10 runs after 2 untimed ones.
fn timed(
    b: &CudaBackend,
    f: impl Fn(&super::device::Gpu, &cudarc::driver::CudaStream) -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    let gpu = b.gpu();
    gpu.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let s = &gpu.decode;
    let ev = |_: ()| {
        gpu.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("event"))
    };
    let (e0, e1) = (ev(())?, ev(())?);
    let mut times = Vec::new();
    for i in 0..12 {
        e0.record(s).map_err(drv("event record"))?;
        f(gpu, s)?;
        e1.record(s).map_err(drv("event record"))?;
        gpu.sync(Which::Decode)?;
        if i >= 2 {
            times.push(e0.elapsed_ms(&e1).map_err(drv("event time"))? as f64);
        }
    }
    Ok(median(times))
}

/// Rows for `n` requests at context `ctx`, pages handed out round-robin over `owners`
/// requests (so active requests' pages interleave with the others'), wrapping around the
/// cache when it is too small.
fn rows_for(b: &CudaBackend, active: &[usize], owners: usize, ctx: usize) -> (Vec<StepRow>, bool) {
    rows_at(b, active, owners, &vec![ctx; active.len()])
}

/// [`rows_for`] with row k of `active` at context `ctxs[k]`.
fn rows_at(
    b: &CudaBackend,
    active: &[usize],
    owners: usize,
    ctxs: &[usize],
) -> (Vec<StepRow>, bool) {
    let p = b.capacity_page_size();
    let total = b.kv_pages();
    let longest = ctxs.iter().copied().max().unwrap_or(0);
    let aliased = (longest + 1).div_ceil(p) * owners > total;
    let rows = active
        .iter()
        .zip(ctxs)
        .map(|(&i, &ctx)| StepRow {
            id: i as u64,
            slot: i as u32,
            context_len: ctx as u32,
            last_token: (i * 7919 % 1000) as u32,
            pages: (0..(ctx + 1).div_ceil(p))
                .map(|j| ((j * owners + i) % total) as u32)
                .collect(),
        })
        .collect();
    (rows, aliased)
}

/// `n` contexts spread evenly over `ctx` × [1 − spread, 1 + spread] (each the midpoint of
/// one of n equal parts, so their mean is `ctx` to rounding), dealt out in a fixed shuffled
/// order: a served batch's rows come in no order of length. `spread` 0 gives `ctx` n times.
pub fn spread_contexts(ctx: usize, n: usize, spread: f64) -> Vec<usize> {
    let spread = spread.clamp(0.0, 1.0);
    let v: Vec<usize> = (0..n)
        .map(|k| {
            let f = (k as f64 + 0.5) / n as f64;
            (ctx as f64 * (1.0 + spread * (2.0 * f - 1.0)))
                .round()
                .max(1.0) as usize
        })
        .collect();
    shuffled(v)
}

/// `n` contexts whose ratios to `ctx` follow the quantile function through `ratios` (at the
/// equally spaced shares 0, 1/m, …, 1 of the rows, linear between; at least two, positive,
/// none below the one before), each row the midpoint of one of n equal parts, scaled so that
/// their mean is `ctx` to rounding (the same KV bytes as a uniform step), in
/// `spread_contexts`' shuffled order. A served batch's mix of lengths, whose longest rows
/// are several times its mean (`tools/gpu/batch_mix.py` reads the ratios off a recording).
pub fn ratio_contexts(ctx: usize, n: usize, ratios: &[f64]) -> Vec<usize> {
    let m = ratios.len().saturating_sub(1).max(1) as f64;
    let at = |f: f64| {
        let x = f * m;
        let i = (x.floor() as usize).min(ratios.len().saturating_sub(2));
        let (a, b) = (ratios[i], ratios.get(i + 1).copied().unwrap_or(ratios[i]));
        a + (b - a) * (x - i as f64)
    };
    let r: Vec<f64> = (0..n).map(|k| at((k as f64 + 0.5) / n as f64)).collect();
    let mean = r.iter().sum::<f64>() / n.max(1) as f64;
    let v = r
        .iter()
        .map(|x| (ctx as f64 * x / mean).round().max(1.0) as usize)
        .collect();
    shuffled(v)
}

/// `ratio_contexts`' rule for its ratios, as an error naming the rule.
pub fn check_ratios(ratios: &[f64]) -> Result<(), String> {
    if ratios.len() < 2 {
        return Err("give at least two ratios (the shortest row's and the longest's)".into());
    }
    if let Some(x) = ratios.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(format!("ratio {x} must be a positive number"));
    }
    if let Some(w) = ratios.windows(2).find(|w| w[1] < w[0]) {
        return Err(format!(
            "ratios are quantiles, each at least the one before: {} follows {}",
            w[1], w[0]
        ));
    }
    Ok(())
}

/// Fisher-Yates with a fixed linear congruential sequence: the same order every run, and no
/// order of length (a served batch's rows come in none).
fn shuffled(mut v: Vec<usize>) -> Vec<usize> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..v.len()).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        v.swap(i, ((x >> 33) % (i as u64 + 1)) as usize);
    }
    v
}

/// What one timed step runs: its rows, how it is launched, and each row's sampling.
#[derive(Clone, Copy)]
struct Run<'a> {
    rows: &'a [StepRow],
    launch: Launch,
    /// None: every row greedy.
    samples: Option<&'a [SampleRow]>,
}

impl<'a> Run<'a> {
    fn greedy(rows: &'a [StepRow], launch: Launch) -> Self {
        Run {
            rows,
            launch,
            samples: None,
        }
    }

    fn step(&self, b: &mut CudaBackend) -> Result<(), BackendError> {
        match self.samples {
            Some(s) => b.decode_sampled(self.rows, s, self.launch, false)?,
            None => b.decode(self.rows, self.launch, false)?,
        };
        Ok(())
    }
}

/// The default sampling of `sampled_ms`: a chat request's usual settings, a seed a row.
pub const SAMPLED: SampleRow = SampleRow {
    temperature: 0.8,
    top_p: 0.95,
    top_k: 50,
    banned: -1,
    key: 0,
};

/// `sampling` in the words of the bench's report.
pub fn describe_sampling(sampling: &SampleRow) -> String {
    let top_k = match sampling.top_k {
        k if k <= 0 => "off".to_string(),
        k => k.to_string(),
    };
    let top_p = match sampling.top_p {
        p if p >= 1.0 => "off".to_string(),
        p => p.to_string(),
    };
    format!(
        "temperature {}, top-p {top_p}, top-k {top_k}",
        sampling.temperature
    )
}

/// Median wall and device milliseconds of each of `runs`, their steps taken in turn: on a
/// card at its power cap the clock drifts over a second of steps, and timed one after the
/// other each would see another clock.
fn time_alternating(
    b: &mut CudaBackend,
    runs: &[Run],
    o: &BenchOptions,
) -> Result<Vec<Timing>, BackendError> {
    for _ in 0..o.warmup {
        for r in runs {
            r.step(b)?;
        }
    }
    b.time_device(true)?;
    let mut wall = vec![Vec::with_capacity(o.iters); runs.len()];
    let mut dev = vec![Vec::with_capacity(o.iters); runs.len()];
    for _ in 0..o.iters {
        for (i, r) in runs.iter().enumerate() {
            let t0 = Instant::now();
            r.step(b)?;
            wall[i].push(t0.elapsed().as_secs_f64() * 1e3);
            if let Some(ms) = b.last_step_device_ms()? {
                dev[i].push(ms);
            }
        }
    }
    b.time_device(false)?;
    Ok(wall
        .into_iter()
        .zip(dev)
        .map(|(w, d)| Timing {
            wall_ms: median(w),
            device_ms: median(d),
        })
        .collect())
}

/// Median milliseconds of a step: on the host's clock, and between events around its
/// kernels on the device.
struct Timing {
    wall_ms: f64,
    device_ms: f64,
}

/// One eager step inside the profiler's capture range.
fn profiled_step(b: &mut CudaBackend, rows: &[StepRow]) -> Result<(), BackendError> {
    b.gpu().sync(Which::Decode)?;
    // SAFETY: plain driver calls on the current context; they only toggle the profiler.
    unsafe { sys::cuProfilerStart() }
        .result()
        .map_err(drv("cuProfilerStart"))?;
    b.decode(rows, Launch::Eager, false)?;
    b.gpu().sync(Which::Decode)?;
    // SAFETY: as above.
    unsafe { sys::cuProfilerStop() }
        .result()
        .map_err(drv("cuProfilerStop"))
}

/// Row 0 decoded at each batch size of `batches` (one graph step each, logits read back),
/// against batch 1. Every batch takes its rows from one layout of `max(batches)` owners, so
/// row 0 reads the same pages at every size; None when that layout would alias pages, or
/// when the model has recurrent layers (each step advances a row's state in place, so row
/// 0's next decode would start from another state than its first).
fn invariance(
    b: &mut CudaBackend,
    batches: &[usize],
    ctx: usize,
) -> Result<Option<Vec<InvarianceRow>>, BackendError> {
    if b.state_bytes() > 0 {
        return Ok(None);
    }
    let owners = batches.iter().copied().max().unwrap_or(1);
    let ids: Vec<usize> = (0..owners).collect();
    let (rows, aliased) = rows_for(b, &ids, owners, ctx);
    if aliased {
        return Ok(None);
    }
    let row0 = |b: &mut CudaBackend, n: usize| -> Result<(u32, Vec<f32>), BackendError> {
        let (toks, mut logits) = b.decode(&rows[..n], Launch::Graph, true)?;
        let first = std::mem::take(&mut logits[0]);
        Ok((toks[0], first))
    };
    let (tok1, alone) = row0(b, 1)?;
    let mut out = Vec::new();
    for &n in batches {
        let (tok, got) = row0(b, n)?;
        let max_abs_diff = got
            .iter()
            .zip(&alone)
            .map(|(a, b)| (a - b).abs() as f64)
            .fold(0.0, f64::max);
        out.push(InvarianceRow {
            batch: n,
            context: ctx,
            splits: live_splits(ctx + 1, b.decode_splits(n)),
            bit_identical: got
                .iter()
                .zip(&alone)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            max_abs_diff,
            same_token: tok == tok1,
        });
    }
    Ok(Some(out))
}

/// Runs the whole benchmark on a backend whose KV cache holds seeded values.
pub fn run(b: &mut CudaBackend, o: &BenchOptions) -> Result<BenchReport, BackendError> {
    let bw = copy_bandwidth(b, o.copy_bytes)?;
    let read_bw = read_bandwidth(b, o.copy_bytes, 0)?;
    // Scattered chunks: one KV page of one kv head is tokens_per_block x head_dim x 2 bytes.
    let read_chunks = [4usize << 10, 8 << 10, 64 << 10]
        .into_iter()
        .map(|c| Ok((c, read_bandwidth(b, o.copy_bytes, c)?)))
        .collect::<Result<Vec<_>, BackendError>>()?;
    let s = b.shape().clone();
    // Every weight is read once per step except the embedding table (B rows of it).
    let embed = (s.vocab * s.hidden * 2) as u64;
    let weights_read = b.weight_bytes() as u64 - if s.tied_embeddings { 0 } else { embed };
    let mut steps = Vec::new();
    for &ctx in &o.contexts {
        for &batch in &o.batches {
            let ids: Vec<usize> = (0..batch).collect();
            let ctxs = o.row_contexts(ctx, batch);
            let (rows, aliased) = rows_at(b, &ids, batch, &ctxs);
            // Graph steps back to back, as a worker runs them: the step time.
            let graph = time_alternating(b, &[Run::greedy(&rows, Launch::Graph)], o)?.remove(0);
            // Eager against graph launches, step by step in turn (an eager step draws more
            // power, which slows the graph steps between them: compared only with each other).
            let pair = time_alternating(
                b,
                &[
                    Run::greedy(&rows, Launch::Graph),
                    Run::greedy(&rows, Launch::Eager),
                ],
                o,
            )?;
            // Every row sampled, each with its own seed, against greedy steps in turn.
            let samples: Vec<SampleRow> = rows
                .iter()
                .map(|r| SampleRow {
                    key: row_key(r.id, u64::from(r.context_len)),
                    ..o.sampling
                })
                .collect();
            let sampled = time_alternating(
                b,
                &[
                    Run::greedy(&rows, Launch::Graph),
                    Run {
                        rows: &rows,
                        launch: Launch::Graph,
                        samples: Some(&samples),
                    },
                ],
                o,
            )?;
            if o.profile {
                profiled_step(b, &rows)?;
            }
            // A hybrid's recurrent layers read and write each row's state once.
            let bytes = weights_read
                + (batch * s.hidden * 2) as u64
                + ctxs.iter().map(|&c| c as u64 + 1).sum::<u64>() * s.kv_bytes_per_token()
                + 2 * batch as u64 * s.recurrent_state_bytes();
            let roofline_ms = bytes as f64 / (bw * 1e9) * 1e3;
            steps.push(StepRowResult {
                batch,
                context: ctx,
                graph_ms: graph.wall_ms,
                graph_device_ms: graph.device_ms,
                eager_ms: pair[1].wall_ms,
                eager_device_ms: pair[1].device_ms,
                eager_over_graph: pair[1].wall_ms / pair[0].wall_ms,
                sampled_ms: sampled[1].wall_ms,
                sampled_over_greedy: sampled[1].wall_ms / sampled[0].wall_ms,
                bytes_read: bytes,
                roofline_ms,
                over_roofline: graph.wall_ms / roofline_ms,
                pages_aliased: aliased,
            });
        }
    }
    let (pb, pc, pn) = o.paused;
    let ids: Vec<usize> = (0..pb).collect();
    let (alone, _) = rows_for(b, &ids, pb, pc);
    // pb + pn residents own interleaved pages; the pn paused ones are left out of the batch.
    let (with, _) = rows_for(b, &ids, pb + pn, pc);
    let t = time_alternating(
        b,
        &[
            Run::greedy(&alone, Launch::Graph),
            Run::greedy(&with, Launch::Graph),
        ],
        o,
    )?;
    let (none_paused_ms, with_paused_ms) = (t[0].wall_ms, t[1].wall_ms);
    // Batch 1 first (the reference), then every other size once, whatever the order asked.
    let mut sizes = o.batches.clone();
    sizes.push(1);
    sizes.sort_unstable();
    sizes.dedup();
    let ctx0 = o.contexts.first().copied().unwrap_or(pc);
    let invariance = invariance(b, &sizes, ctx0)?.unwrap_or_default();
    Ok(BenchReport {
        device: b.device_name().to_string(),
        shape: s.name.clone(),
        launch: b.step_options().describe(),
        sampling: describe_sampling(&o.sampling),
        weight_bytes: b.weight_bytes(),
        kv_pages: b.kv_pages(),
        tokens_per_block: b.capacity_page_size(),
        copy_bandwidth_gbs: bw,
        read_bandwidth_gbs: read_bw,
        read_chunks_gbs: read_chunks,
        context_spread: o.context_spread,
        context_ratios: o.context_ratios.clone(),
        steps,
        pause: PauseResult {
            batch: pb,
            context: pc,
            paused: pn,
            none_paused_ms,
            with_paused_ms,
        },
        invariance,
    })
}

/// A readable table of the report.
pub fn table(r: &BenchReport) -> String {
    let mut s = format!(
        "{} {} ({})  weights {:.2} GB  copy bandwidth {:.0} GB/s (read+write)  \
         read bandwidth {:.0} GB/s\n",
        r.device,
        r.shape,
        r.launch,
        r.weight_bytes as f64 / 1e9,
        r.copy_bandwidth_gbs,
        r.read_bandwidth_gbs
    );
    if !r.read_chunks_gbs.is_empty() {
        let chunks: Vec<String> = r
            .read_chunks_gbs
            .iter()
            .map(|(c, g)| format!("{} KiB {g:.0}", c >> 10))
            .collect();
        s += &format!("read in scattered chunks, GB/s: {}\n", chunks.join(", "));
    }
    s += &format!("sampled steps: {}\n", r.sampling);
    if !r.context_ratios.is_empty() {
        let ratios: Vec<String> = r.context_ratios.iter().map(|x| format!("{x}")).collect();
        s += &format!(
            "contexts: each step's rows at the quantiles {} of the context (mean kept), \
             shuffled\n",
            ratios.join(",")
        );
    } else if r.context_spread > 0.0 {
        s += &format!(
            "contexts: each step's rows spread over context x [{:.2}, {:.2}], shuffled\n",
            1.0 - r.context_spread,
            1.0 + r.context_spread
        );
    }
    s += "batch  context   graph_ms  device_ms   eager_ms  eager/graph  sampled_ms  \
          sampled/greedy  roofline_ms  x_roofline  aliased\n";
    for x in &r.steps {
        s += &format!(
            "{:5}  {:7}  {:9.3}  {:9.3}  {:9.3}  {:11.3}  {:10.3}  {:14.3}  {:11.3}  {:10.3}  \
             {}\n",
            x.batch,
            x.context,
            x.graph_ms,
            x.graph_device_ms,
            x.eager_ms,
            x.eager_over_graph,
            x.sampled_ms,
            x.sampled_over_greedy,
            x.roofline_ms,
            x.over_roofline,
            x.pages_aliased
        );
    }
    let p = &r.pause;
    s += &format!(
        "pause: batch {} context {}: none paused {:.3} ms, {} paused in place {:.3} ms\n",
        p.batch, p.context, p.none_paused_ms, p.paused, p.with_paused_ms
    );
    for x in &r.invariance {
        let how = match (x.bit_identical, x.same_token) {
            (true, _) => "bit-identical".to_string(),
            (false, same) => format!(
                "max |diff| {:.2e}, {} token",
                x.max_abs_diff,
                if same { "same" } else { "another" }
            ),
        };
        s += &format!(
            "row 0 at batch {:3} vs alone, context {} ({} attention splits): {how}\n",
            x.batch, x.context, x.splits
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{check_ratios, ratio_contexts, spread_contexts, BenchOptions};

    #[test]
    fn spread_contexts_keep_the_mean_and_span_the_asked_range_in_no_order_of_length() {
        assert_eq!(spread_contexts(4096, 5, 0.0), vec![4096; 5]);
        let v = spread_contexts(4096, 128, 0.9);
        assert_eq!(v.len(), 128);
        let mean = v.iter().sum::<usize>() as f64 / 128.0;
        assert!((mean - 4096.0).abs() < 1.0, "mean {mean}");
        let (lo, hi) = (*v.iter().min().unwrap(), *v.iter().max().unwrap());
        assert!(
            (410..=440).contains(&lo) && (7750..=7790).contains(&hi),
            "{lo}..{hi}"
        );
        assert!(!v.windows(2).all(|w| w[0] >= w[1]), "already longest first");
        assert!(!v.windows(2).all(|w| w[0] <= w[1]), "sorted by length");
        assert_eq!(
            v,
            spread_contexts(4096, 128, 0.9),
            "the same order every run"
        );
    }

    #[test]
    fn ratio_contexts_follow_the_quantiles_and_keep_the_mean() {
        // Two ratios 1 - F and 1 + F are the spread of F.
        assert_eq!(
            ratio_contexts(4096, 128, &[0.1, 1.9]),
            spread_contexts(4096, 128, 0.9)
        );
        // A tail: half the rows at 0.5, the other half rising to 4x; mean kept at 2048.
        let v = ratio_contexts(2048, 100, &[0.5, 0.5, 4.0]);
        let mean = v.iter().sum::<usize>() as f64 / 100.0;
        assert!((mean - 2048.0).abs() < 1.0, "mean {mean}");
        let mut sorted = v.clone();
        sorted.sort_unstable();
        // Before scaling: 50 rows at 0.5, then 0.535 ... 3.965, mean 1.375.
        assert_eq!(sorted[0], (2048.0 * 0.5 / 1.375_f64).round() as usize);
        assert_eq!(sorted[49], sorted[0]);
        assert_eq!(sorted[99], (2048.0 * 3.965 / 1.375_f64).round() as usize);
        assert_ne!(v, sorted, "shuffled");
    }

    /// The backend is sized for the longest row of any point and for the pause comparison's
    /// context, which runs whatever the points' contexts are.
    #[test]
    fn the_longest_context_covers_every_points_rows_and_the_pause_comparison() {
        let short = |spread: f64, ratios: Vec<f64>| BenchOptions {
            batches: vec![64, 128],
            contexts: vec![1000, 1773],
            context_spread: spread,
            context_ratios: ratios,
            ..BenchOptions::default()
        };
        assert_eq!(
            short(0.0, vec![]).longest_context(),
            4096,
            "the pause comparison's"
        );
        let o = short(0.0, vec![0.5, 0.5, 4.0]);
        let longest_row = [64, 128]
            .iter()
            .flat_map(|&n| o.row_contexts(1773, n))
            .max()
            .unwrap();
        assert!(longest_row > 4096, "{longest_row}");
        assert_eq!(o.longest_context(), longest_row);
        let o = BenchOptions {
            contexts: vec![4096],
            ..short(0.5, vec![])
        };
        assert_eq!(o.longest_context(), 6144);
    }

    #[test]
    fn ratios_must_be_two_or_more_positive_quantiles() {
        assert!(check_ratios(&[0.5, 1.0, 7.0]).is_ok());
        assert!(check_ratios(&[1.0]).unwrap_err().contains("at least two"));
        assert!(check_ratios(&[0.0, 1.0]).unwrap_err().contains("positive"));
        assert!(check_ratios(&[2.0, 1.0])
            .unwrap_err()
            .contains("1 follows 2"));
    }
}

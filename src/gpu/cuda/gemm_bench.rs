//! `genslot-gpu gemm-bench`: every weight product of a decode step (QKV, O, gate-up, down,
//! LM head) at decode-sized row counts, through cuBLAS and through each weight-streaming
//! variant, checked against cuBLAS and timed. The weights rotate over enough copies that
//! every launch reads them from HBM, as a step does (one layer's weights never stay in L2
//! until the next step). The table behind `gemm::choose`.

use cudarc::driver::sys;
use serde::Serialize;

use super::device::{drv, DevBuf, Gpu, Which};
use super::gemm::{Variant, VARIANTS};
use super::shape::ModelShape;
use crate::gpu::BackendError;

/// One weight product of the decode step.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    pub name: &'static str,
    pub out: usize,
    pub inp: usize,
    /// Adds into a float32 output (the residual), as O and down do.
    pub accumulate: bool,
    pub y_f32: bool,
}

/// The products of one layer and the LM head, as `forward::enqueue` issues them.
pub fn cases(s: &ModelShape) -> Vec<Case> {
    let c = |name, out, inp, accumulate, y_f32| Case {
        name,
        out,
        inp,
        accumulate,
        y_f32,
    };
    vec![
        c("qkv", s.qkv_dim(), s.hidden, false, false),
        c("o", s.hidden, s.heads * s.head_dim, true, true),
        c("gate_up", 2 * s.ffn, s.hidden, false, false),
        c("down", s.hidden, s.ffn, true, true),
        c("lm_head", s.vocab, s.hidden, false, true),
    ]
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub case: String,
    pub rows: usize,
    /// `cublas` or a kernel name.
    pub path: String,
    pub us: f64,
    /// Weight bytes over the time.
    pub weight_gbs: f64,
    /// ‖y − y_cublas‖ / ‖y_cublas‖ with float32 output (0 for cuBLAS itself).
    pub rel_err: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub device: String,
    pub shape: String,
    pub points: Vec<Point>,
}

struct Bufs {
    w: DevBuf,
    copies: usize,
    x: DevBuf,
    y: DevBuf,
    y_ref: DevBuf,
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        num += (x - y) * (x - y);
        den += y * y;
    }
    if a.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs every case at every row count in `rows`; `iters` launches per timing (median of 5).
pub fn run(shape: &ModelShape, rows: &[usize], iters: usize) -> Result<Report, BackendError> {
    let gpu = Gpu::new(0, (shape.head_dim, shape.heads / shape.kv_heads.max(1)))?;
    gpu.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let mut points = Vec::new();
    for (ci, case) in cases(shape).into_iter().enumerate() {
        let bytes = case.out * case.inp * 2;
        // At least 2 GiB of weights in rotation: several times the 60 MB of L2.
        let copies = (2usize << 30).div_ceil(bytes).clamp(2, 64);
        let b = Bufs {
            w: gpu.alloc(bytes * copies, Which::Decode)?,
            copies,
            x: gpu.alloc(max_rows * case.inp * 2, Which::Decode)?,
            y: gpu.alloc(max_rows * case.out * 4, Which::Decode)?,
            y_ref: gpu.alloc(max_rows * case.out * 4, Which::Decode)?,
        };
        // Weights as the seeded init draws them (±1/sqrt(inp)), inputs of unit scale.
        let wscale = 1.0 / (case.inp as f32).sqrt();
        gpu.init_uniform(
            Which::Decode,
            b.w.ptr,
            (bytes * copies / 2) as u64,
            11,
            ci as u32,
            wscale,
            0.0,
        )?;
        gpu.init_uniform(
            Which::Decode,
            b.x.ptr,
            (max_rows * case.inp) as u64,
            12,
            ci as u32,
            1.0,
            0.0,
        )?;
        gpu.sync(Which::Decode)?;
        for &r in rows {
            let reference = check_output(&gpu, &case, &b, r, None)?;
            let t = time(&gpu, &case, &b, r, None, iters)?;
            points.push(point(&case, r, "cublas".into(), t, bytes, 0.0));
            for v in candidates(r) {
                let got = check_output(&gpu, &case, &b, r, Some(v))?;
                let err = rel_err(&got, &reference);
                let t = time(&gpu, &case, &b, r, Some(v), iters)?;
                points.push(point(&case, r, v.kernel_name(), t, bytes, err));
            }
        }
    }
    Ok(Report {
        device: gpu.name.clone(),
        shape: shape.name.clone(),
        points,
    })
}

/// The narrowest instance of each block height that takes `rows` rows.
fn candidates(rows: usize) -> Vec<Variant> {
    let mut v: Vec<Variant> = [1, 2]
        .into_iter()
        .filter_map(|mt| Variant::for_rows(rows, mt))
        .collect();
    v.dedup();
    debug_assert!(v.iter().all(|c| VARIANTS.contains(c)));
    v
}

fn point(case: &Case, rows: usize, path: String, us: f64, bytes: usize, rel_err: f64) -> Point {
    Point {
        case: case.name.to_string(),
        rows,
        path,
        us,
        weight_gbs: bytes as f64 / (us * 1e-6) / 1e9,
        rel_err,
    }
}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    case: &Case,
    b: &Bufs,
    rows: usize,
    v: Option<Variant>,
    copy: usize,
    y: u64,
    accumulate: bool,
    y_f32: bool,
) -> Result<(), BackendError> {
    let w = b.w.ptr + (copy * case.out * case.inp * 2) as u64;
    let (out, inp) = (case.out, case.inp);
    match v {
        None => gpu.gemm(
            Which::Decode,
            out,
            rows,
            inp,
            w,
            b.x.ptr,
            y,
            accumulate,
            y_f32,
        ),
        Some(v) => gpu.stream_gemm(
            Which::Decode,
            v,
            out,
            rows,
            inp,
            w,
            b.x.ptr,
            y,
            accumulate,
            y_f32,
        ),
    }
}

/// The float32 output of one launch on copy 0, after checking the other output modes: adding
/// into an output must give twice the plain result, and the bf16 output its rounding.
fn check_output(
    gpu: &Gpu,
    case: &Case,
    b: &Bufs,
    rows: usize,
    v: Option<Variant>,
) -> Result<Vec<f32>, BackendError> {
    let n = rows * case.out;
    let read = |buf: &DevBuf| -> Result<Vec<f32>, BackendError> {
        let mut h = vec![0f32; n];
        gpu.dtoh(Which::Decode, &mut h, buf.ptr)?;
        Ok(h)
    };
    // Poison: every element must be written.
    let nan = vec![f32::NAN; n];
    gpu.htod(Which::Decode, b.y.ptr, &nan)?;
    launch(gpu, case, b, rows, v, 0, b.y.ptr, false, true)?;
    let plain = read(&b.y)?;
    if let Some(i) = plain.iter().position(|x| !x.is_finite()) {
        return Err(BackendError::Failed(format!(
            "{} {rows} rows: element {i} not written ({:?})",
            case.name,
            v.map(|v| v.kernel_name())
        )));
    }
    launch(gpu, case, b, rows, v, 0, b.y.ptr, true, true)?;
    let twice = read(&b.y)?;
    let doubled: Vec<f32> = plain.iter().map(|x| 2.0 * x).collect();
    let e = rel_err(&twice, &doubled);
    if e > 1e-5 {
        return Err(BackendError::Failed(format!(
            "{} {rows} rows {:?}: accumulate gives {e:.2e} off twice the product",
            case.name,
            v.map(|v| v.kernel_name())
        )));
    }
    launch(gpu, case, b, rows, v, 0, b.y.ptr, false, false)?;
    let mut half = vec![0u16; n];
    gpu.dtoh(Which::Decode, &mut half, b.y.ptr)?;
    let widened: Vec<f32> = half
        .iter()
        .map(|&h| f32::from_bits((h as u32) << 16))
        .collect();
    let e = rel_err(&widened, &plain);
    if e > 4e-3 {
        return Err(BackendError::Failed(format!(
            "{} {rows} rows {:?}: bf16 output {e:.2e} off the float32 one",
            case.name,
            v.map(|v| v.kernel_name())
        )));
    }
    Ok(plain)
}

/// Median over 5 runs of `iters` launches (rotating over the weight copies) of the time per
/// launch, in µs, in the case's own output mode.
fn time(
    gpu: &Gpu,
    case: &Case,
    b: &Bufs,
    rows: usize,
    v: Option<Variant>,
    iters: usize,
) -> Result<f64, BackendError> {
    let ev = || {
        gpu.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("event"))
    };
    let (e0, e1) = (ev()?, ev()?);
    let s = &gpu.decode;
    let mut times = Vec::new();
    for rep in 0..6 {
        e0.record(s).map_err(drv("event record"))?;
        for i in 0..iters {
            let copy = (rep * iters + i) % b.copies;
            launch(
                gpu,
                case,
                b,
                rows,
                v,
                copy,
                b.y_ref.ptr,
                case.accumulate,
                case.y_f32,
            )?;
        }
        e1.record(s).map_err(drv("event record"))?;
        gpu.sync(Which::Decode)?;
        if rep > 0 {
            times.push(e0.elapsed_ms(&e1).map_err(drv("event time"))? as f64 * 1e3 / iters as f64);
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// Per case and row count: cuBLAS and each variant, µs (weight GB/s), the fastest marked.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "{} {}: µs per product (weight GB/s); * fastest; err = rel. L2 vs cuBLAS\n",
        r.device, r.shape
    );
    let mut keys: Vec<(String, usize)> = Vec::new();
    for p in &r.points {
        let k = (p.case.clone(), p.rows);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (case, rows) in keys {
        let ps: Vec<&Point> = r
            .points
            .iter()
            .filter(|p| p.case == case && p.rows == rows)
            .collect();
        let best = ps.iter().map(|p| p.us).fold(f64::INFINITY, f64::min);
        s += &format!("{case:8} {rows:4}");
        for p in ps {
            let mark = if p.us == best { "*" } else { " " };
            s += &format!(
                "  {}{} {:7.1} ({:4.0}) err {:.1e}",
                mark, p.path, p.us, p.weight_gbs, p.rel_err
            );
        }
        s += "\n";
    }
    s
}

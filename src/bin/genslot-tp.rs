//! genslot-tp: the tensor-parallel measurements on a multi-GPU host.
//!
//! `allreduce` checks an NCCL all-reduce across the GPUs and times it over a range of
//! sizes; `roofline` measures the HBM bandwidth and the all-reduce times a decode step of
//! each batch needs, and prints the TP decode step's lower bound (weights and KV per rank
//! over HBM, plus two all-reduces a layer) for a grid of batches × contexts. Without CUDA,
//! NCCL or enough GPUs it says so and exits with status 2.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use genslot::gpu::cuda::tp::nccl::{self, AllReduceTiming};
use genslot::gpu::cuda::tp::roofline::{interpolate, tp_step, RESIDUAL_BYTES};
use genslot::gpu::cuda::ModelShape;
use serde_json::json;

#[derive(Parser)]
#[command(about = "Tensor-parallel checks and measurements (NCCL, roofline)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check one all-reduce, then time all-reduces from 4 KiB to 256 MiB.
    Allreduce {
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        #[arg(long, default_value_t = 50)]
        iters: usize,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The TP decode step's lower bound from the measured HBM and all-reduce rates.
    Roofline {
        #[arg(long, default_value = "llama-8b")]
        shape: String,
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,64,128")]
        batches: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "4096,32768")]
        contexts: Vec<usize>,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Allreduce { ranks, iters, json } => allreduce(ranks, iters, json),
        Cmd::Roofline {
            shape,
            ranks,
            batches,
            contexts,
            json,
        } => roofline(&shape, ranks, &batches, &contexts, json),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// NCCL and `ranks` GPUs, or exit 2 with the reason.
fn require(ranks: usize) -> Result<()> {
    let have = nccl::nccl_version().and_then(|v| Ok((v, nccl::device_count()?)));
    match have {
        Ok((v, n)) if n >= ranks => {
            println!("NCCL {v}, {n} GPUs");
            Ok(())
        }
        Ok((_, n)) => {
            eprintln!("skipping: {ranks} ranks need {ranks} GPUs, this host has {n}");
            std::process::exit(2)
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            std::process::exit(2)
        }
    }
}

fn write_json(path: Option<PathBuf>, v: serde_json::Value) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(&p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn check_sum(ranks: usize) -> Result<()> {
    let count = 1 << 16;
    let held = nccl::all_reduce_once(ranks, count)?;
    let n = ranks as f32;
    for (rank, v) in held.iter().enumerate() {
        for (i, &x) in v.iter().enumerate() {
            let want = n * (n + 1.0) / 2.0 + n * i as f32 / 1000.0;
            if (x - want).abs() > 1e-3 * want.abs().max(1.0) {
                bail!("rank {rank} index {i}: {x}, want {want}");
            }
        }
    }
    println!("all-reduce of {count} f32 over {ranks} ranks: sums correct on every rank");
    Ok(())
}

fn print_timings(t: &[AllReduceTiming]) {
    println!(
        "{:>12} {:>10} {:>10} {:>10}",
        "bytes", "us", "algbw GB/s", "busbw GB/s"
    );
    for x in t {
        println!(
            "{:>12} {:>10.1} {:>10.1} {:>10.1}",
            x.bytes,
            x.secs * 1e6,
            x.alg_bw / 1e9,
            x.bus_bw / 1e9
        );
    }
}

fn allreduce(ranks: usize, iters: usize, json: Option<PathBuf>) -> Result<()> {
    require(ranks)?;
    check_sum(ranks)?;
    let sizes: Vec<usize> = (12..=28).step_by(2).map(|p| 1usize << p).collect();
    let t = nccl::time_all_reduce(ranks, &sizes, iters)?;
    print_timings(&t);
    let rows: Vec<_> = t
        .iter()
        .map(|x| json!({"bytes": x.bytes, "secs": x.secs, "alg_bw": x.alg_bw, "bus_bw": x.bus_bw}))
        .collect();
    write_json(
        json,
        json!({"ranks": ranks, "iters": iters, "allreduce": rows}),
    )
}

/// Device-to-device copies of 1 GiB on GPU 0: read + write bytes over the time.
fn hbm_bandwidth() -> Result<f64> {
    use cudarc::driver::CudaContext;
    let ctx = CudaContext::new(0).context("context")?;
    let stream = ctx.default_stream();
    let bytes = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(bytes).context("alloc")?;
    let mut dst = stream.alloc_zeros::<u8>(bytes).context("alloc")?;
    stream.memcpy_dtod(&src, &mut dst).context("copy")?;
    stream.synchronize().context("sync")?;
    let n = 10;
    let t0 = Instant::now();
    for _ in 0..n {
        stream.memcpy_dtod(&src, &mut dst).context("copy")?;
    }
    stream.synchronize().context("sync")?;
    Ok((2 * bytes * n) as f64 / t0.elapsed().as_secs_f64())
}

fn roofline(
    shape: &str,
    ranks: usize,
    batches: &[usize],
    contexts: &[usize],
    json: Option<PathBuf>,
) -> Result<()> {
    let s = ModelShape::named(shape)?;
    require(ranks)?;
    let hbm = hbm_bandwidth()?;
    println!("HBM (device copy, GPU 0): {:.0} GB/s", hbm / 1e9);
    let mut sizes: Vec<usize> = batches
        .iter()
        .map(|b| b * s.hidden * RESIDUAL_BYTES)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let timings = nccl::time_all_reduce(ranks, &sizes, 200)?;
    print_timings(&timings);
    let points: Vec<(u64, f64)> = timings.iter().map(|t| (t.bytes as u64, t.secs)).collect();
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>12} {:>9}",
        "batch", "context", "memory ms", "allred ms", "bound ms", "allred %"
    );
    let mut rows = Vec::new();
    for &b in batches {
        for &c in contexts {
            let step = tp_step(&s, ranks, b, c, hbm, |bytes| interpolate(&points, bytes))?;
            println!(
                "{:>6} {:>8} {:>10.3} {:>10.3} {:>12.3} {:>8.1}%",
                b,
                c,
                step.memory_s * 1e3,
                step.allreduce_s * 1e3,
                step.total_s * 1e3,
                step.allreduce_share * 100.0
            );
            rows.push(json!(step));
        }
    }
    write_json(
        json,
        json!({"shape": shape, "ranks": ranks, "hbm_bw": hbm, "allreduce": points, "steps": rows}),
    )
}

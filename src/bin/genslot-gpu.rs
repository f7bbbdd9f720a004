//! genslot-gpu: checks and measures the CUDA backend on a GPU host.
//!
//! `probe` reports the CUDA libraries; `check-tiny` compares the seeded `tiny` model on the
//! GPU with the f32 CPU reference; `parity` compares a checkpoint against a PyTorch reference
//! (tools/gpu/parity.py); `bench` measures decode steps against the HBM roofline.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use genslot::gpu::cuda::{
    bench, parity, CudaBackend, CudaConfig, Launch, LibraryProbe, ModelSource,
};

#[derive(Parser)]
#[command(about = "Check and benchmark the genslot CUDA backend")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Report which CUDA libraries load.
    Probe,
    /// Seeded tiny model on the GPU against the f32 CPU reference.
    CheckTiny {
        #[arg(long, default_value_t = 16)]
        steps: usize,
        /// Fail above this max relative logits error.
        #[arg(long, default_value_t = 3e-2)]
        tol: f64,
    },
    /// A HF checkpoint against a reference run written by tools/gpu/parity.py.
    Parity {
        #[arg(long)]
        weights: PathBuf,
        #[arg(long = "ref")]
        reference: PathBuf,
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long, default_value_t = 1e-2)]
        tol: f64,
        /// Also run the f32 CPU model on this many prompts (fed the reference's tokens) and
        /// compare it with the reference: tells model-semantics gaps from bf16 rounding.
        #[arg(long, default_value_t = 0)]
        cpu_prompts: usize,
        #[arg(long, default_value_t = 4)]
        cpu_steps: usize,
        /// Only the CPU check (no GPU needed).
        #[arg(long)]
        cpu_only: bool,
    },
    /// Decode step time against the roofline.
    Bench {
        #[arg(long, default_value = "llama-8b")]
        shape: String,
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long, default_value_t = 20)]
        iters: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,32,64,128")]
        batches: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "4096,32768")]
        contexts: Vec<usize>,
        /// Share of free device memory given to the KV cache (smaller under a profiler).
        #[arg(long, default_value_t = 0.85)]
        kv_fraction: f64,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let probe = LibraryProbe::run();
    if let Cmd::Probe = cli.cmd {
        println!("{probe:?}");
        if !probe.all_present() {
            std::process::exit(2);
        }
        return Ok(());
    }
    if let Cmd::Parity {
        weights,
        reference,
        cpu_prompts,
        cpu_steps,
        cpu_only: true,
        ..
    } = &cli.cmd
    {
        let r = parity::Reference::load(reference)?;
        return cpu_check(weights, &r, (*cpu_prompts).max(1), *cpu_steps);
    }
    probe.require()?;
    match cli.cmd {
        Cmd::Probe => {}
        Cmd::CheckTiny { steps, tol } => {
            let shape = genslot::gpu::cuda::ModelShape::named("tiny")?;
            let cpu = genslot::gpu::cuda::cpu_ref::CpuModel::seeded(&shape, 11);
            let prompts: Vec<Vec<u32>> = [5usize, 33, 70, 1]
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    (0..n)
                        .map(|j| ((j * 131 + i * 17 + 3) % 1024) as u32)
                        .collect()
                })
                .collect();
            let r = parity::cpu_reference(&cpu, &prompts, steps);
            for launch in [Launch::Graph, Launch::Eager] {
                let mut cfg = CudaConfig::new(ModelSource::Seeded {
                    shape: "tiny".into(),
                    seed: 11,
                });
                cfg.max_batch_size = 8;
                cfg.kv_pages = Some(64);
                cfg.tokens_per_block = 16;
                cfg.max_context = 1024;
                cfg.prefill_chunk = 32; // several chunks for the 70-token prompt
                cfg.cuda_graphs = launch == Launch::Graph;
                let mut b = CudaBackend::new(cfg)?;
                let rep = parity::run(&mut b, &r, launch)?;
                println!(
                    "check-tiny {launch:?} on {}: {}",
                    b.device_name(),
                    serde_json::to_string(&rep)?
                );
                if rep.max_rel_err.is_nan() || rep.max_rel_err > tol {
                    bail!("max relative error {} above {tol}", rep.max_rel_err);
                }
            }
        }
        Cmd::Parity {
            weights,
            reference,
            json,
            tol,
            cpu_prompts,
            cpu_steps,
            ..
        } => {
            let r = parity::Reference::load(&reference)?;
            if cpu_prompts > 0 {
                cpu_check(&weights, &r, cpu_prompts, cpu_steps)?;
            }
            let mut cfg = CudaConfig::new(ModelSource::Checkpoint(weights.clone()));
            cfg.max_batch_size = r.meta.prompts.len().max(1);
            cfg.max_context = 4096;
            cfg.kv_pages = Some(1024);
            cfg.tokens_per_block = 16;
            let mut b =
                CudaBackend::new(cfg).with_context(|| format!("loading {}", weights.display()))?;
            let rep = parity::run(&mut b, &r, Launch::Graph)?;
            let line = serde_json::to_string_pretty(&rep)?;
            println!(
                "parity {} on {}: {line}",
                weights.display(),
                b.device_name()
            );
            if let Some(p) = json {
                std::fs::write(&p, line).with_context(|| format!("writing {}", p.display()))?;
            }
            if rep.max_rel_err.is_nan() || rep.max_rel_err > tol {
                bail!("max relative error {} above {tol}", rep.max_rel_err);
            }
        }
        Cmd::Bench {
            shape,
            json,
            iters,
            batches,
            contexts,
            kv_fraction,
        } => {
            let mut cfg = CudaConfig::new(ModelSource::Seeded { shape, seed: 1 });
            cfg.max_batch_size = batches.iter().copied().max().unwrap_or(1).max(112);
            cfg.max_context = contexts.iter().copied().max().unwrap_or(4096) + 64;
            cfg.kv_memory_fraction = kv_fraction;
            let mut b = CudaBackend::new(cfg)?;
            b.fill_kv_random(7)?;
            let opts = bench::BenchOptions {
                batches,
                contexts,
                iters,
                ..Default::default()
            };
            let rep = bench::run(&mut b, &opts)?;
            print!("{}", bench::table(&rep));
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rep)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
        }
    }
    Ok(())
}

/// f32 CPU model from the checkpoint against the reference's bf16 and float32 rows.
fn cpu_check(
    weights: &std::path::Path,
    r: &parity::Reference,
    prompts: usize,
    steps: usize,
) -> Result<()> {
    use genslot::gpu::cuda::{cpu_ref::CpuModel, safetensors::Checkpoint, ModelShape};
    let shape = ModelShape::from_hf_config(&weights.join("config.json"))?;
    let ck = Checkpoint::open(weights)?;
    let m = CpuModel::try_from_fn(&shape, |t| ck.f32(&t.hf_name()))
        .with_context(|| format!("loading {} into the CPU model", weights.display()))?;
    let cpu = parity::cpu_forced(&m, &r.meta, prompts, steps);
    let per = steps.min(r.meta.steps) + 1;
    for k in 0..prompts.min(r.meta.prompts.len()) {
        let (mut vs16, mut vs32) = (0f64, 0f64);
        for (pos, row) in cpu[k * per..(k + 1) * per].iter().enumerate() {
            let (b16, f32r) = r.rows(k, pos);
            vs16 = vs16.max(parity::rel_errors(row, b16).0);
            if let Some(f) = f32r {
                vs32 = vs32.max(parity::rel_errors(row, f).0);
            }
        }
        println!(
            "cpu f32 model, prompt {k} ({} tokens), {per} positions: max rel err vs reference bf16 \
             {vs16:.5}, vs reference float32 {vs32:.5}",
            r.meta.prompts[k].len()
        );
    }
    Ok(())
}

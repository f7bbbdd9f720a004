//! genslot-gpu: checks and measures the CUDA backend on a GPU host.
//!
//! `probe` reports the CUDA libraries; `check-tiny` compares the seeded `tiny` model on the
//! GPU with the f32 CPU reference; `check-model` does the same for a real checkpoint's chat
//! answer; `parity` compares a checkpoint against a PyTorch reference (tools/gpu/parity.py);
//! `bench` measures decode steps against the HBM roofline; `gemv` compares and times each
//! weight product on cuBLAS and on the GEMV kernels; `check-retained` checks the
//! drafter and the hybrid shape's recurrent state (outputs identical with drafting and across
//! pauses, the hybrid against its CPU reference). Without a GPU: `kernels` writes
//! or compiles (NVRTC, with ptxas's register report) the kernel source of a shape, and
//! `export-hf` writes a checkpoint (a GGUF, say) as a Hugging Face one for PyTorch.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use genslot::gpu::cuda::model_files::{write_hf_checkpoint_with, ModelFiles};
use genslot::gpu::cuda::{
    all_attn_shapes, bench, gemv_bench, kernel_source, parity, sampler_bench, CudaBackend,
    CudaConfig, Launch, LibraryProbe, ModelShape, ModelSource, StepOptions,
};
use genslot::gpu::StepRow;
use genslot::sampling::SampleRow;
use genslot::server::tokenize::{ChatTurn, Tokenizer};
use genslot::text::ModelText;

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
        /// `tiny`, or `tiny-hybrid` (recurrent layers).
        #[arg(long, default_value = "tiny")]
        shape: String,
        #[arg(long, default_value_t = 16)]
        steps: usize,
        /// Fail above this max relative logits error.
        #[arg(long, default_value_t = 3e-2)]
        tol: f64,
    },
    /// A real checkpoint's chat answer on the GPU against the f32 CPU reference (bf16
    /// weights): greedy tokens free-running for `steps`, EOS ignored, and logits teacher-forced.
    CheckModel {
        /// A GGUF file or a Hugging Face directory.
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "What is the capital of France?")]
        prompt: String,
        #[arg(long, default_value_t = 32)]
        steps: usize,
        /// Fail unless the GPU's answer (up to EOS) contains this.
        #[arg(long)]
        expect: Option<String>,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A HF checkpoint against a reference run written by tools/gpu/parity.py. Passes when
    /// our max relative error against the reference's float32 run is no larger than the
    /// reference's own bf16 run's (SPEC §6); without a float32 run, when it is within `tol`
    /// of the reference's bf16 logits.
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
    /// Writes the kernel source for a shape (or every shape), or compiles it with NVRTC
    /// for sm_90 and prints ptxas's registers, shared memory and spills (needs libnvrtc
    /// only, no GPU).
    Kernels {
        /// A named shape (tiny, llama-1b, llama-8b); default: every head_dim and group.
        #[arg(long)]
        shape: Option<String>,
        /// A checkpoint whose shape to use.
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Compile and print the resource report instead of the source.
        #[arg(long)]
        ptxas: bool,
    },
    /// Writes a checkpoint (GGUF or HF) as a Hugging Face one: config.json and
    /// model.safetensors in bf16, Q and K in HF's layout.
    ExportHf {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// The retained state: greedy tokens with prompt-lookup drafting equal plain ones on a
    /// repetitive and a non-repetitive prompt set (tokens per step and wall time of each),
    /// paused requests equal their solo runs (drafter on; hybrid shape), `tiny-hybrid`
    /// against its f32 CPU reference. Fails unless every output is identical.
    CheckRetained {
        /// Tokens generated per request.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        /// A checkpoint for the chat prompt sets (a GGUF file or a HF directory).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value_t = 4)]
        max_draft_len: u32,
        #[arg(long, default_value_t = 256)]
        window: u32,
        #[arg(long, default_value_t = 3)]
        ngram: u32,
        #[arg(long)]
        json: Option<PathBuf>,
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
        /// Tokens per KV page (the backend's `tokens_per_block`).
        #[arg(long, default_value_t = 32)]
        tokens_per_block: usize,
        /// One more eager step per point inside cuProfilerStart/Stop, for
        /// `ncu --profile-from-start off` (tools/gpu/ncu_summary.py sums it per kernel).
        #[arg(long)]
        profile: bool,
        /// The sampling of the sampled steps (`sampled_ms`): TEMPERATURE,TOP_P,TOP_K, with
        /// top-p 1 and top-k 0 for off (temperature alone: `1,1,0`).
        #[arg(long, default_value = "0.8,0.95,50", value_parser = parse_sampling)]
        sampling: SampleRow,
        /// Spread each step's rows over context × [1 − F, 1 + F] (0 to 1) in a shuffled
        /// order, the same KV bytes as F = 0: a batch that mixes short and long requests.
        #[arg(long, default_value_t = 0.0, value_parser = parse_spread)]
        context_spread: f64,
        /// Each step's rows at these ratios to the context instead, as quantiles (the
        /// shortest row's, ..., the longest's, equally spaced; the mean kept): a served
        /// batch's mix, e.g. from `tools/gpu/batch_mix.py RECORDING`.
        #[arg(long, value_delimiter = ',', conflicts_with = "context_spread")]
        context_ratios: Vec<f64>,
    },
    /// Each weight product at 1 to 4 rows on cuBLAS and on the GEMV kernels: outputs
    /// compared, times side by side.
    Gemv {
        #[arg(long, default_value = "llama-8b")]
        shape: String,
        #[arg(long, default_value_t = 200)]
        iters: usize,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The device sampler alone on seeded Gaussian logits: each mode at each spread (the
    /// logits' standard deviation, which sets how many tokens top-p keeps) and row count,
    /// every token checked against the host sampler.
    Sampler {
        #[arg(long, default_value = "llama-8b")]
        shape: String,
        #[arg(long, default_value_t = 200)]
        iters: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,3,4,6")]
        spreads: Vec<f32>,
        #[arg(long, value_delimiter = ',', default_value = "1,64,128")]
        batches: Vec<usize>,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// `--context-spread F`: a share of the context from 0 to 1.
fn parse_spread(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{s}: expected a number from 0 to 1")),
    }
}

/// `--sampling TEMPERATURE,TOP_P,TOP_K` as the request's sampling parameters would give it:
/// a positive temperature (a greedy step is what the bench times beside it), top-p in (0, 1],
/// top-k 0 (off) or more.
fn parse_sampling(s: &str) -> Result<SampleRow, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [t, p, k] = parts[..] else {
        return Err(format!("{s:?}: expected TEMPERATURE,TOP_P,TOP_K"));
    };
    let num = |v: &str, what: &str| {
        v.parse::<f32>()
            .map_err(|_| format!("{what} {v:?} is not a number"))
    };
    let temperature = num(t, "temperature")?;
    let top_p = num(p, "top-p")?;
    let top_k: i32 = k
        .parse()
        .map_err(|_| format!("top-k {k:?} is not a whole number"))?;
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(format!("temperature {temperature} must be above 0"));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("top-p {top_p} must be in (0, 1]"));
    }
    if top_k < 0 {
        return Err(format!("top-k {top_k} must be 0 (off) or more"));
    }
    Ok(SampleRow {
        temperature,
        top_p,
        top_k,
        ..bench::SAMPLED
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let probe = LibraryProbe::run();
    match &cli.cmd {
        Cmd::Kernels {
            shape,
            model,
            out,
            ptxas,
        } => return kernels(shape.as_deref(), model.as_deref(), out.as_deref(), *ptxas),
        Cmd::ExportHf { model, out } => return export_hf(model, out),
        _ => {}
    }
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
        Cmd::CheckRetained {
            tokens,
            model,
            max_draft_len,
            window,
            ngram,
            json,
        } => {
            use genslot::gpu::cuda::retained_gpu::{run, RetainedOptions};
            let draft = genslot::gpu::cuda::draft::DraftConfig {
                window,
                max_draft_len,
                max_ngram: ngram,
            };
            let rep = run(&RetainedOptions {
                tokens,
                model,
                draft,
            })?;
            let line = serde_json::to_string_pretty(&rep)?;
            println!("check-retained: {line}");
            if let Some(p) = json {
                std::fs::write(&p, &line).with_context(|| format!("writing {}", p.display()))?;
            }
            if !rep.identical {
                bail!("an output differs (see `identical` per set above)");
            }
        }
        Cmd::CheckTiny { shape, steps, tol } => {
            let name = shape;
            let shape = genslot::gpu::cuda::ModelShape::named(&name)?;
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
                    shape: name.clone(),
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
                    "check-tiny {name} {launch:?} on {}: {}",
                    b.device_name(),
                    serde_json::to_string(&rep)?
                );
                if rep.max_rel_err.is_nan() || rep.max_rel_err > tol {
                    bail!("max relative error {} above {tol}", rep.max_rel_err);
                }
            }
        }
        Cmd::Kernels { .. } | Cmd::ExportHf { .. } => {}
        Cmd::CheckModel {
            model,
            prompt,
            steps,
            expect,
            json,
        } => check_model(&model, &prompt, steps, expect.as_deref(), json.as_deref())?,
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
            match (&rep.vs_f32, rep.criterion_met) {
                (Some(c), Some(false)) => bail!(
                    "our max relative error against float32 ({:.5}) is larger than the \
                     reference's own bf16 run's ({:.5})",
                    c.ours_max_rel_err,
                    c.reference_bf16_max_rel_err
                ),
                (Some(c), _) => println!(
                    "criterion met: ours {:.5} <= reference bf16 {:.5} (max rel err vs float32)",
                    c.ours_max_rel_err, c.reference_bf16_max_rel_err
                ),
                (None, _) if rep.max_rel_err.is_nan() || rep.max_rel_err > tol => {
                    bail!("max relative error {} above {tol}", rep.max_rel_err)
                }
                (None, _) => {}
            }
        }
        Cmd::Bench {
            shape,
            json,
            iters,
            batches,
            contexts,
            kv_fraction,
            tokens_per_block,
            profile,
            sampling,
            context_spread,
            context_ratios,
        } => {
            if !context_ratios.is_empty() {
                bench::check_ratios(&context_ratios)
                    .map_err(|e| anyhow::anyhow!("--context-ratios: {e}"))?;
            }
            let opts = bench::BenchOptions {
                batches,
                contexts,
                iters,
                profile,
                sampling,
                context_spread,
                context_ratios,
                ..Default::default()
            };
            let mut cfg = CudaConfig::new(ModelSource::Seeded { shape, seed: 1 });
            cfg.tokens_per_block = tokens_per_block;
            cfg.max_batch_size = opts.batches.iter().copied().max().unwrap_or(1).max(112);
            cfg.max_context = opts.longest_context() + 64;
            cfg.kv_memory_fraction = kv_fraction;
            let mut b = CudaBackend::new(cfg)?;
            b.fill_kv_random(7)?;
            let rep = bench::run(&mut b, &opts)?;
            print!("{}", bench::table(&rep));
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rep)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
        }
        Cmd::Gemv { shape, iters, json } => {
            let s = ModelShape::named(&shape)?;
            let rep = gemv_bench::run(&s, StepOptions::from_env()?, iters.max(1))?;
            println!("{} · {} · {}", rep.device, rep.shape, rep.launch);
            println!("product   rows   cuBLAS µs  GB/s    GEMV µs  GB/s    max rel err");
            for r in &rep.rows {
                println!(
                    "{:<9} {:>4} {:>10.2} {:>6.0} {:>10.2} {:>6.0}    {:.2e}",
                    r.product,
                    r.rows,
                    r.cublas_us,
                    r.cublas_gbs,
                    r.gemv_us,
                    r.gemv_gbs,
                    r.max_rel_err
                );
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rep)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
            // f32 sums in another order: a bf16 rounding step at most (NaN fails too).
            if let Some(r) = rep
                .rows
                .iter()
                .find(|r| r.max_rel_err.is_nan() || r.max_rel_err >= 1e-2)
            {
                bail!(
                    "GEMV differs from cuBLAS: {} at {} rows, max relative error {:.2e}",
                    r.product,
                    r.rows,
                    r.max_rel_err
                );
            }
        }
        Cmd::Sampler {
            shape,
            iters,
            spreads,
            batches,
            json,
        } => {
            let s = ModelShape::named(&shape)?;
            if let Some(bad) = spreads.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                bail!("spread {bad} must be a positive number");
            }
            if batches.contains(&0) {
                bail!("batch sizes must be at least 1");
            }
            let rep = sampler_bench::run(
                &s,
                StepOptions::from_env()?,
                &spreads,
                &batches,
                iters.max(1),
            )?;
            println!("{} · vocab {} · {}", rep.device, rep.vocab, rep.launch);
            for n in &rep.nucleus {
                println!(
                    "spread {}: top-p 0.95 at temperature 0.8 keeps {} tokens (median row), {} at most",
                    n.spread, n.median, n.max
                );
            }
            println!("spread  mode                    rows        µs   host's token");
            for p in &rep.points {
                println!(
                    "{:>6}  {:<22} {:>5} {:>9.1}   {}/{}",
                    p.spread, p.mode, p.rows, p.us, p.agree, p.rows
                );
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&rep)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
        }
    }
    Ok(())
}

/// The kernel source for a shape (or all), written out or compiled for the ptxas report.
fn kernels(
    shape: Option<&str>,
    model: Option<&Path>,
    out: Option<&Path>,
    ptxas: bool,
) -> Result<()> {
    let attn = match (shape, model) {
        (Some(n), _) => {
            let s = ModelShape::named(n)?;
            vec![(s.head_dim, s.group())]
        }
        (None, Some(m)) => {
            let s = ModelFiles::open(m)?.shape;
            vec![(s.head_dim, s.group())]
        }
        (None, None) => all_attn_shapes(),
    };
    let src = kernel_source(&attn);
    if !ptxas {
        match out {
            Some(p) => {
                std::fs::write(p, &src).with_context(|| format!("writing {}", p.display()))?
            }
            None => print!("{src}"),
        }
        return Ok(());
    }
    if !LibraryProbe::run().nvrtc {
        bail!("libnvrtc not found (LD_LIBRARY_PATH=/usr/local/cuda/lib64, or the nvidia-cuda-nvrtc wheel's lib)");
    }
    let csrc = std::ffi::CString::new(src).context("kernel source holds a NUL")?;
    let prog = cudarc::nvrtc::result::create_program(&csrc, None)
        .map_err(|e| anyhow::anyhow!("nvrtcCreateProgram: {e:?}"))?;
    // The attention block the backend would compile (GENSLOT_ATTN_WARPS, _STAGES).
    let ring = StepOptions::from_env()?.attn_ring;
    let mut opts: Vec<String> = [
        "--gpu-architecture=sm_90",
        "--std=c++17",
        "--ptxas-options=-v",
    ]
    .map(String::from)
    .to_vec();
    opts.extend(ring.defines());
    // SAFETY: `prog` is a live program created above and destroyed below.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog, &opts) };
    // SAFETY: as above.
    let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }
        .map_err(|e| anyhow::anyhow!("nvrtcGetProgramLog: {e:?}"))?;
    // SAFETY: as above; the program is not used after this.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    let log: Vec<u8> = log
        .iter()
        .map(|&c| c as u8)
        .take_while(|&c| c != 0)
        .collect();
    let log = String::from_utf8_lossy(&log);
    let mut entry = String::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().unwrap_or_default().to_string();
        } else if line.contains("registers") || line.contains("spill") || line.contains("error") {
            println!("{entry:<28} {}", line.trim_start_matches("ptxas").trim());
        }
    }
    compiled.map_err(|e| anyhow::anyhow!("NVRTC: {e:?}\n{log}"))?;
    Ok(())
}

/// A checkpoint written as a Hugging Face one (bf16), for PyTorch.
fn export_hf(model: &Path, out: &Path) -> Result<()> {
    let files = ModelFiles::open(model)?;
    write_hf_checkpoint_with(out, &files.shape, |t| {
        files.tensor_bf16(t).map_err(std::io::Error::other)
    })
    .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "wrote {} ({} layers, {} over {} heads, vocab {}) to {}",
        model.display(),
        files.shape.layers,
        files.shape.heads,
        files.shape.kv_heads,
        files.shape.vocab,
        out.display()
    );
    Ok(())
}

/// What `check-model` measured.
#[derive(serde::Serialize)]
struct CheckModel {
    model: String,
    device: String,
    prompt_tokens: usize,
    steps: usize,
    /// Leading greedy tokens on which the GPU and the CPU reference agree (of steps + 1).
    equal_prefix: usize,
    gpu_answer: String,
    cpu_answer: String,
    gpu_text: String,
    cpu_text: String,
    teacher_forced: parity::ParityReport,
}

fn check_model(
    model: &Path,
    prompt: &str,
    steps: usize,
    expect: Option<&str>,
    json: Option<&Path>,
) -> Result<()> {
    let text = ModelText::load(model)?;
    let tok = &text.tokenizer;
    let chat = tok
        .try_render_chat(&[ChatTurn {
            role: "user".into(),
            content: prompt.into(),
        }])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ids = tok.try_encode(&chat).map_err(|e| anyhow::anyhow!("{e}"))?;
    let t0 = std::time::Instant::now();
    let cpu = ModelFiles::open(model)?.cpu_model(true)?;
    let reference = parity::cpu_reference(&cpu, std::slice::from_ref(&ids), steps);
    drop(cpu);
    eprintln!("CPU reference: {:.1} s", t0.elapsed().as_secs_f64());
    let mut cfg = CudaConfig::new(ModelSource::Checkpoint(model.to_path_buf()));
    cfg.max_batch_size = 4;
    cfg.kv_pages = Some(512);
    cfg.tokens_per_block = 16;
    cfg.max_context = 4096;
    let mut b = CudaBackend::new(cfg)?;
    let teacher_forced = parity::run(&mut b, &reference, Launch::Graph)?;
    let pages: Vec<u32> = (256..512).collect();
    let (mut t, _) = b.prefill(1000, &ids, &pages)?;
    let mut gpu = vec![t];
    for s in 0..steps {
        let row = StepRow {
            id: 1000,
            slot: 0,
            context_len: (ids.len() + s) as u32,
            last_token: t,
            pages: pages.clone(),
        };
        t = b.decode(&[row], Launch::Graph, false)?.0[0];
        gpu.push(t);
    }
    let cpu_toks = &reference.meta.tokens[0];
    let equal_prefix = gpu.iter().zip(cpu_toks).take_while(|(a, c)| a == c).count();
    let answer = |toks: &[u32]| {
        let end = toks
            .iter()
            .position(|&x| Some(x) == text.eos)
            .unwrap_or(toks.len());
        tok.decode(&toks[..end])
    };
    let rep = CheckModel {
        model: model.display().to_string(),
        device: b.device_name().to_string(),
        prompt_tokens: ids.len(),
        steps,
        equal_prefix,
        gpu_answer: answer(&gpu),
        cpu_answer: answer(cpu_toks),
        gpu_text: tok.decode(&gpu),
        cpu_text: tok.decode(cpu_toks),
        teacher_forced,
    };
    let line = serde_json::to_string_pretty(&rep)?;
    println!("{line}");
    if let Some(p) = json {
        std::fs::write(p, &line).with_context(|| format!("writing {}", p.display()))?;
    }
    if equal_prefix < steps {
        bail!(
            "greedy tokens agree for {equal_prefix} of {} only",
            steps + 1
        );
    }
    if let Some(want) = expect {
        if !rep.gpu_answer.contains(want) {
            bail!("the answer {:?} does not contain {want:?}", rep.gpu_answer);
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
    let m = ModelFiles::open(weights)
        .and_then(|f| f.cpu_model(false))
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
             {vs16:.5}, vs reference float32 {vs32:.2e}",
            r.meta.prompts[k].len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_sampling_reads_three_values_and_refuses_what_a_request_could_not_ask() {
        let s = parse_sampling("0.7, 1, 0").unwrap();
        assert_eq!((s.temperature, s.top_p, s.top_k), (0.7, 1.0, 0));
        assert_eq!(
            bench::describe_sampling(&s),
            "temperature 0.7, top-p off, top-k off"
        );
        let d = parse_sampling("0.8,0.95,50").unwrap();
        assert_eq!(d, bench::SAMPLED);
        for bad in [
            "1,1", "0,1,0", "1,0,0", "1,1.5,0", "1,1,-1", "1,x,0", "1,1,2.5",
        ] {
            assert!(parse_sampling(bad).is_err(), "{bad}");
        }
    }
}

//! `genslot sim`: argument handling, workload loading, output files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};

use super::arm::ArmSpec;
use super::engine::{RunSpec, Workload};
use super::{presets, report, run_experiment, svg, timeline, Experiment, ExperimentResult};
use crate::config::Config;
use crate::policy::admission::AdmissionParams;
use crate::workload::{load_trace, SynthParams, SyntheticAgentic, Trace};

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Plant preset: reference (calibrated to the reference's GPU control) or default
    /// (the embedded config's timing model).
    #[arg(long, default_value = "reference")]
    pub preset: String,
    /// Take the plant (timing, batch, KV) and admission settings from this config instead.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Trace file: Weka (JSON/JSONL, gzip or plain), Mooncake JSONL or Azure CSV.
    /// Without it, a synthetic agentic workload fitted to the Weka traces is used.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Sessions of the synthetic workload.
    #[arg(long, default_value_t = 2000)]
    pub synthetic_sessions: usize,
    /// Closed-loop lanes (AgentX concurrency).
    #[arg(long, default_value_t = 220)]
    pub concurrency: usize,
    /// Run the same arms at these concurrencies (comma-separated), e.g. 130,160,190,220,250.
    #[arg(long, value_delimiter = ',')]
    pub sweep: Vec<usize>,
    #[arg(long, default_value_t = 16)]
    pub seeds: u64,
    /// Simulated seconds per run.
    #[arg(long, default_value_t = 3600.0)]
    pub duration: f64,
    /// Seconds at the start of each run that are not measured.
    #[arg(long, default_value_t = 300.0)]
    pub warmup: f64,
    /// Comma-separated arms: control, tpot_budget=B, target_output_tps=T|auto,
    /// max_batch_size=N, combined with `+` (order=auto|guard_first|fcfs|edf, victim=...).
    #[arg(
        long,
        default_value = "control,tpot_budget=0.10,target_output_tps=auto"
    )]
    pub arms: String,
    /// Override the preset's output-length scale (recorded outputs × this).
    #[arg(long)]
    pub output_scale: Option<f64>,
    /// Override the preset's AgentX idle cap on gaps, seconds.
    #[arg(long)]
    pub idle_cap: Option<f64>,
    /// Override the step model's jump above its jump batch size, ms (with a jump batch).
    #[arg(long)]
    pub jump_ms: Option<f64>,
    /// Override the step model's extra ms per request past its jump batch size.
    #[arg(long)]
    pub per_request_above_ms: Option<f64>,
    /// X's window for every arm, control included: the number of recent waited TTFTs X is
    /// the percentile of (SPEC §4.2; default 1000). X forms at min(200, this) samples.
    #[arg(long)]
    pub target_window: Option<usize>,
    /// X's percentile for every arm, in (0, 100) (default 90).
    #[arg(long)]
    pub ttft_percentile: Option<f64>,
    /// An operator-set X in seconds for every arm, control included, instead of the
    /// percentile (an experiment outside SPEC §4.2: the queue with an anchored target).
    #[arg(long)]
    pub fixed_target: Option<f64>,
    /// Open-loop traces: multiply the arrival rate.
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Worker threads (seeds run in parallel); default: every core.
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also draw each arm's first-seed timeline (X, waited-TTFT p90, paused, waiting every
    /// 30 simulated seconds) to this SVG, and put the timelines into the JSON.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn workload(args: &SimArgs) -> anyhow::Result<Workload> {
    match &args.trace {
        None => {
            let sessions = SyntheticAgentic::new(SynthParams::default())
                .generate(args.synthetic_sessions, 0x5eed);
            Ok(Workload::Sessions(Arc::from(sessions)))
        }
        Some(path) => {
            let trace = load_trace(path, None)
                .with_context(|| format!("loading trace {}", path.display()))?;
            Ok(match trace {
                Trace::Sessions(s) => Workload::Sessions(Arc::from(s)),
                Trace::Requests { requests, .. } => {
                    Workload::Timed(Arc::from(requests), args.rate_scale)
                }
            })
        }
    }
}

fn svg_path(base: &Path, c: usize, sweep: bool) -> PathBuf {
    if !sweep {
        return base.to_path_buf();
    }
    let stem = base.file_stem().and_then(|s| s.to_str()).unwrap_or("ttft");
    base.with_file_name(format!("{stem}-c{c}.svg"))
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let arms = ArmSpec::parse_list(&args.arms)?;
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    if !(args.duration > args.warmup && args.warmup >= 0.0) {
        bail!(
            "--duration ({}) must exceed --warmup ({})",
            args.duration,
            args.warmup
        );
    }
    let (plant, admission) = match &args.config {
        Some(path) => {
            let c = Config::from_file(path)?;
            let a = &c.scheduler_config.gen_admission;
            let adm = AdmissionParams {
                policy: a.policy,
                ttft_percentile: a.ttft_percentile,
                target_window: a.target_window as usize,
                min_samples: a.min_samples as usize,
                max_waiting: a.max_waiting as usize,
                fixed_target: None,
            };
            (
                super::plant::Plant::from_timing(
                    "config",
                    &c.timing,
                    c.max_batch_size,
                    c.kv_cache_config.max_tokens,
                ),
                adm,
            )
        }
        None => {
            let p = presets::preset(&args.preset).with_context(|| {
                format!(
                    "unknown preset `{}` (one of {})",
                    args.preset,
                    presets::NAMES.join(", ")
                )
            })?;
            (p, AdmissionParams::default())
        }
    };
    let mut admission = admission;
    if let Some(w) = args.target_window {
        if w == 0 {
            bail!("--target-window must be at least 1");
        }
        admission.target_window = w;
        admission.min_samples = admission.min_samples.min(w);
    }
    if let Some(q) = args.ttft_percentile {
        if !(q > 0.0 && q < 100.0) {
            bail!("--ttft-percentile must be in (0, 100)");
        }
        admission.ttft_percentile = q;
    }
    if let Some(x) = args.fixed_target {
        if !(x.is_finite() && x > 0.0) {
            bail!("--fixed-target must be a positive number of seconds");
        }
        admission.fixed_target = Some(x);
    }
    let mut plant = plant;
    if let Some(x) = args.output_scale {
        if !(x > 0.0 && x.is_finite()) {
            bail!("--output-scale must be > 0");
        }
        plant.output_scale = x;
    }
    if let Some(x) = args.idle_cap {
        if x.is_nan() || x < 0.0 {
            bail!("--idle-cap must be >= 0");
        }
        plant.idle_cap_s = x;
    }
    for (flag, value, field) in [
        ("--jump-ms", args.jump_ms, &mut plant.step.jump_ms),
        (
            "--per-request-above-ms",
            args.per_request_above_ms,
            &mut plant.step.per_request_above_ms,
        ),
    ] {
        if let Some(x) = value {
            if !(x.is_finite() && x >= 0.0) {
                bail!("{flag} must be >= 0");
            }
            *field = x;
        }
    }
    let workload = workload(&args)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let loads = if args.sweep.is_empty() {
        vec![args.concurrency]
    } else {
        args.sweep.clone()
    };
    let mut all: Vec<ExperimentResult> = Vec::new();
    for &c in &loads {
        let exp = Experiment {
            base: RunSpec {
                plant: plant.clone(),
                admission,
                workload: workload.clone(),
                concurrency: c,
                duration_s: args.duration,
                warmup_s: args.warmup,
                seed: 0,
            },
            arms: arms.clone(),
            seeds: args.seeds,
            threads,
            progress: !args.quiet,
        };
        let mut r = run_experiment(&exp).map_err(anyhow::Error::msg)?;
        let queue = match (r.target_window, r.ttft_percentile, r.fixed_target) {
            (_, _, Some(x)) => format!(", X fixed at {x} s"),
            (None, None, None) => String::new(),
            (w, q, None) => format!(
                ", X = p{} of the last {} waited TTFTs",
                q.unwrap_or(admission.ttft_percentile),
                w.unwrap_or(admission.target_window)
            ),
        };
        println!(
            "\n== c{c}, preset {}, {} seeds x {} s (first {} s unmeasured){queue}{} ==",
            r.preset,
            r.seeds,
            r.duration_s,
            r.warmup_s,
            r.target_output_tps
                .map_or(String::new(), |t| format!(", T = {t:.1} tok/s"))
        );
        print!("{}", report::arm_table(&r.arms));
        print!("{}", report::paired_table(&r.paired));
        for w in &r.warnings {
            println!("warning: {w}");
        }
        println!(
            "speed: {:.0} simulated s per wall s per core, {:.2e} events/s, {} runs in {:.1} s wall",
            r.speed.simulated_s_per_wall_s, r.speed.events_per_s, r.speed.runs, r.speed.wall_s
        );
        if r.speed.arms.len() > 1 {
            let per_arm: Vec<String> = r
                .speed
                .arms
                .iter()
                .map(|a| format!("{} {:.0}", a.name, a.simulated_s_per_wall_s))
                .collect();
            println!("speed per arm: {}", per_arm.join(", "));
        }
        if let Some(base) = &args.svg {
            let path = svg_path(base, c, loads.len() > 1);
            let title = format!("TTFT CDF, c{c}, preset {}, {} seeds", r.preset, r.seeds);
            std::fs::write(&path, svg::ttft_cdf(&title, &r.ttft_samples))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        match &args.timeline {
            Some(base) => {
                let path = svg_path(base, c, loads.len() > 1);
                let title = format!("Controller timeline, c{c}, preset {}, seed 0", r.preset);
                std::fs::write(&path, timeline::svg(&title, &r.timelines))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => r.timelines.clear(),
        }
        all.push(r);
    }
    if let Some(path) = &args.json {
        let text = if all.len() == 1 {
            serde_json::to_string_pretty(&all[0])?
        } else {
            serde_json::to_string_pretty(&serde_json::json!({ "sweep": all }))?
        };
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

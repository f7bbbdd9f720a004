//! `genslot sim`: argument handling, workload loading, output files.

use super::out::{say, sayln};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};

use super::arm::{ArmSpec, ModeSpec};
use super::engine::{RunSpec, Workload};
use super::plant::Plant;
use super::{
    bench, calibrate, count, load_label, presets, report, run_experiment, run_experiment_keeping,
    served, svg, timeline, ArmRecords, Experiment, ExperimentResult, PlantOverrides, WorkloadInfo,
};
use crate::config::{rule, Config, MAX_ENTRIES, MAX_SECONDS, MAX_TIMING_UNIT};
use crate::policy::admission::AdmissionParams;
use crate::workload::context::context_lengths;
use crate::workload::{
    load_recording, load_trace, ContextTransform, LengthStats, Recording, SynthParams,
    SyntheticAgentic, Trace, TraceFormat, TransformError, WorkloadError,
};

/// Closed-loop lanes without --concurrency (the reference's load).
const DEFAULT_CONCURRENCY: usize = 220;

/// `--json` of a replay: the served run's summary beside the experiment's fields.
#[derive(serde::Serialize)]
struct ReplayJson<'a> {
    served: &'a served::ServedSummary,
    #[serde(flatten)]
    experiment: &'a ExperimentResult,
}

#[derive(Debug, Clone, clap::Args)]
// A negative number is a value (refused by its flag's rule), not a flag.
#[command(allow_negative_numbers = true)]
pub struct SimArgs {
    /// Plant preset: reference (calibrated to the reference's GPU control), h200-llama-8b (fitted
    /// to the cuda backend on the H200 machine) or default
    /// (the embedded config's timing model).
    #[arg(long, default_value = "reference", conflicts_with = "config")]
    pub preset: String,
    /// Take the plant (timing, batch, KV) and admission settings from this config instead.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Trace file: Weka (JSON/JSONL, gzip or plain), Mooncake JSONL or Azure CSV.
    /// Without it, a synthetic agentic workload fitted to the Weka traces is used.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The --trace file's format: auto tells it from the content (a directory is Weka);
    /// naming it has the format's reader say what a file lacks.
    #[arg(long, value_enum, default_value_t = TraceFormatArg::Auto, requires = "trace")]
    pub trace_format: TraceFormatArg,
    /// Replay a served run recorded with `genslot serve --record FILE`: its arrivals, open
    /// loop, straight to the GEN worker, under every arm. Prints the served run's own
    /// TTFT and TPOT beside the simulated control. Defaults with it: one seed (the arrivals
    /// are fixed), the whole recording measured (--warmup 0, --duration = its span).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["trace", "sweep"])]
    pub replay: Option<PathBuf>,
    /// Multiply every prompt length by F in (0, 1], thinning prefix blocks so prefix reuse
    /// keeps its shape (the same transform as loadgen's --context-scale).
    #[arg(long, value_name = "F")]
    pub context_scale: Option<f64>,
    /// Cut every prompt to its first N tokens (after --context-scale).
    #[arg(long, value_name = "N")]
    pub max_context: Option<u32>,
    /// Sessions of the synthetic workload (without --trace or --replay), 1 to 100,000.
    #[arg(long, default_value_t = 2000, conflicts_with_all = ["trace", "replay"])]
    pub synthetic_sessions: usize,
    /// Closed-loop lanes (AgentX concurrency), 1 to 100,000 [default: 220]. Weka and
    /// synthetic sessions only: Mooncake and Azure traces and --replay run open loop.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Run the same arms at these concurrencies (comma-separated), e.g. 130,160,190,220,250,
    /// instead of one --concurrency.
    #[arg(long, value_delimiter = ',', conflicts_with = "concurrency")]
    pub sweep: Vec<usize>,
    /// Seeds, paired across arms [default: 16; 1 with --replay or a Mooncake or Azure
    /// trace, whose runs are the same for every seed].
    #[arg(long)]
    pub seeds: Option<u64>,
    /// The seeds run S, S + 1, ... [default: 0]. A seed places the AgentX lanes as loadgen's
    /// --seed does, so `--first-seed K --seeds 1` runs the lanes of `loadgen --seed K` on
    /// the same trace, rules and context transform: that served run's simulated twin.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub first_seed: u64,
    /// Simulated seconds per run, at most 1e6 [default: 3600; with --replay, the recording's
    /// span].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds at the start of each run that are not measured, below --duration
    /// [default: 300; 0 with --replay].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Comma-separated arms: control, tpot_budget=B, target_output_tps=T|auto,
    /// max_batch_size=N, max_num_active_requests=N, combined with `+` (order=NAME,
    /// victim=NAME: a pop order or victim rule by its name; an unknown name is refused with
    /// the valid ones listed; g0=G: where tpot_budget's window gain starts; g_from=paused:
    /// g held until a paused request completes; pauses=N: tpot_budget's pauses per request,
    /// SPEC §4.3's 2 by default).
    #[arg(
        long,
        default_value = "control,tpot_budget=0.10,target_output_tps=auto"
    )]
    pub arms: String,
    /// Recorded outputs × this, in (0, 100]. Without it, the preset's scale applies to Weka
    /// and synthetic sessions (the traces it was fitted to) and 1 to Mooncake and Azure traces
    /// and recordings. The run's header states any scale but 1.
    #[arg(long)]
    pub output_scale: Option<f64>,
    /// Override the preset's AgentX idle cap on gaps, seconds (inf: no cap).
    #[arg(long)]
    pub idle_cap: Option<f64>,
    /// Closed-loop lanes: after each completion a lane waits a delay drawn uniformly from
    /// [0, this) ms before its next send, seeded by the run's seed with loadgen's draw, so
    /// `--first-seed K --send-jitter 40` waits what `loadgen --seed K` (default 40ms) does.
    /// Default 0: lanes send the instant their previous request completes.
    #[arg(long, value_name = "MS")]
    pub send_jitter: Option<f64>,
    /// Override the step model's jump above its jump batch size, ms (with a jump batch).
    #[arg(long)]
    pub jump_ms: Option<f64>,
    /// Override the step model's extra ms per request past its jump batch size.
    #[arg(long)]
    pub per_request_above_ms: Option<f64>,
    /// Every step term x F, in [0.25, 4]: a card that much slower or faster than the one the
    /// timing was fitted on. `auto` (with --replay of a control run): the factor at which the
    /// replayed control's mean TPOT over the window equals the served run's, found by
    /// bisection and stated in the header and the JSON (`plant_overrides.step_scale`); pass
    /// that factor to the replays of the other arms' recordings from the same machine.
    #[arg(long, value_name = "F|auto", value_parser = parse_step_scale)]
    pub step_scale: Option<StepScaleArg>,
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
    /// Mooncake and Azure traces (open loop): multiply the arrival rate [default: 1].
    #[arg(long)]
    pub rate_scale: Option<f64>,
    /// Worker threads (seeds run in parallel); default: every core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the results to this JSON file: the run's settings (plant, workload, overrides),
    /// each arm's summary, the paired deltas, the speed and the warnings; with --sweep, one
    /// such object per load under `sweep`.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw every arm's TTFT CDF (all seeds pooled) to this SVG; with --sweep, one file per
    /// load, the load added to the name (X.svg -> X-c130.svg, ...).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Also draw each arm's first-seed timeline (X, waited-TTFT p90, g, paused, waiting every
    /// 30 simulated seconds) to this SVG, and put the timelines into the JSON; with --sweep,
    /// one file per load as with --svg.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Write every measured request that completed to this JSONL file, one line each: arm,
    /// seed, sent_s (from the run's start: a recording's arrival_s less its first), ttft_s,
    /// e2e_s, tpot_s, queue_s, context_s, decode_s, input_tokens, output_tokens; to set a twin
    /// beside its served run request by request or window by window. With --sweep, one file
    /// per load as with --svg.
    #[arg(long, value_name = "FILE")]
    pub records: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Time the simulator instead of reporting results: run the experiment RUNS times
    /// (default 7) in this process and print each run's speed, the median and the best, and
    /// the peak resident memory (BENCHMARKS.md §2). Writes no tables or files.
    #[arg(
        long,
        value_name = "RUNS",
        num_args = 0..=1,
        default_missing_value = "7",
        conflicts_with_all = ["json", "svg", "timeline", "records", "sweep"]
    )]
    pub bench: Option<usize>,
}

/// `--trace-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormatArg {
    Auto,
    Weka,
    Mooncake,
    Azure,
}

impl TraceFormatArg {
    fn format(self) -> Option<TraceFormat> {
        match self {
            Self::Auto => None,
            Self::Weka => Some(TraceFormat::Weka),
            Self::Mooncake => Some(TraceFormat::Mooncake),
            Self::Azure => Some(TraceFormat::Azure),
        }
    }
}

/// `--step-scale`: a factor, or `auto` (fitted to a recording's TPOT).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepScaleArg {
    Factor(f64),
    Auto,
}

fn parse_step_scale(s: &str) -> Result<StepScaleArg, String> {
    if s == "auto" {
        return Ok(StepScaleArg::Auto);
    }
    s.parse()
        .map(StepScaleArg::Factor)
        .map_err(|_| format!("a factor such as 1.05, or auto; got `{s}`"))
}

/// `--step-scale auto`: the factor at which the replayed control decodes at the served
/// control's mean TPOT (`calibrate`), each try one seed of the control alone.
fn auto_step_scale(base: &RunSpec, served_tpot_ms: f64) -> anyhow::Result<calibrate::ScaleFit> {
    let control = ArmSpec::parse_list("control")?;
    let fit = calibrate::fit_step_scale(served_tpot_ms, |factor| {
        let mut spec = base.clone();
        spec.plant.step = spec.plant.step.scaled(factor);
        let exp = Experiment {
            base: spec,
            arms: control.clone(),
            seeds: 1,
            threads: 1,
            progress: false,
        };
        let r = run_experiment(&exp)?;
        Ok(r.arms.first().map_or(f64::NAN, |a| a.mean_tpot_ms))
    })
    .context("--step-scale auto")?;
    Ok(fit)
}

/// The workload, with the context transform applied to a trace or the synthetic sessions,
/// and the trace's format (Weka for the synthetic sessions, which are fitted to the Weka
/// traces).
fn workload(
    args: &SimArgs,
    transform: &ContextTransform,
) -> anyhow::Result<(Workload, TraceFormat)> {
    let mut trace = match &args.trace {
        None => Trace::Sessions(
            SyntheticAgentic::new(SynthParams::default()).generate(args.synthetic_sessions, 0x5eed),
        ),
        // The loader's errors name the file (and the line): the context names the flag.
        Some(path) => load_trace(path, args.trace_format.format()).map_err(|e| match e {
            WorkloadError::UnknownFormat { .. } => {
                anyhow::anyhow!("--trace: {e}; --trace-format names it")
            }
            e => anyhow::Error::from(e).context("--trace"),
        })?,
    };
    let format = trace.format();
    check_flags_fit(args, format)?;
    if !transform.is_identity() {
        let before = LengthStats::of(&context_lengths(&trace));
        transform.apply(&mut trace);
        let after = LengthStats::of(&context_lengths(&trace));
        if let (Some(b), Some(a)) = (before, after) {
            sayln!(
                "context transform: {}; prompt tokens mean {:.0} -> {:.0}, p50 {} -> {}, \
                 p90 {} -> {}, p99 {} -> {}, max {} -> {} ({} requests)",
                transform.describe(),
                b.mean,
                a.mean,
                b.p50,
                a.p50,
                b.p90,
                a.p90,
                b.p99,
                a.p99,
                b.max,
                a.max,
                a.requests
            );
        }
    }
    let workload = match trace {
        Trace::Sessions(s) => {
            if !s.iter().any(|s| s.total_requests() > 0) {
                let what = args.trace.as_ref().map_or_else(
                    || "the synthetic workload".to_owned(),
                    |p| format!("--trace {}", p.display()),
                );
                bail!("{what}: no session in it has a request, so there is nothing to replay");
            }
            Workload::Sessions(Arc::from(s))
        }
        Trace::Requests { requests, .. } => {
            Workload::Timed(Arc::from(requests), args.rate_scale.unwrap_or(1.0))
        }
    };
    Ok((workload, format))
}

/// The plant (the `model` backend's timing, batch and KV) and the admission settings a
/// serving config describes: what `--config` simulates.
pub fn from_config(c: &Config) -> (Plant, AdmissionParams) {
    let admission = c.admission();
    let plant = Plant::from_timing(
        "config",
        &c.timing,
        c.max_batch_size,
        c.kv_cache_config.max_tokens,
    );
    (plant, admission)
}

/// Run length, warm-up and seeds: the flags, else the defaults (a recording's own span).
fn run_shape(args: &SimArgs, recording: Option<&Recording>) -> anyhow::Result<(f64, f64, u64)> {
    if let Some(d) = args.duration {
        flag("--duration", rule::seconds(d))?;
    }
    if let Some(w) = args.warmup {
        flag("--warmup", rule::finite_within(w, 0.0, MAX_SECONDS))?;
    }
    let (duration, warmup, seeds) = match recording {
        // Just past the last arrival, so every recorded request is measured.
        Some(r) => (
            args.duration.unwrap_or(r.span_s() + 1e-3),
            args.warmup.unwrap_or(0.0),
            args.seeds.unwrap_or(1),
        ),
        None => (
            args.duration.unwrap_or(3600.0),
            args.warmup.unwrap_or(300.0),
            args.seeds.unwrap_or(16),
        ),
    };
    // Each seed is a run of every arm, its records kept for the tables: bounded like the
    // config's counts.
    flag("--seeds", rule::count(seeds, MAX_ENTRIES))?;
    if args.duration.is_none() && rule::seconds(duration).is_err() {
        bail!(
            "the recording spans {duration} s, beyond the {MAX_SECONDS} s a run may last: \
             set --duration"
        );
    }
    if !(duration > warmup && warmup >= 0.0) {
        bail!("--duration ({duration}) must exceed --warmup ({warmup})");
    }
    Ok((duration, warmup, seeds))
}

/// A flag's value against its rule: the error names the flag.
fn flag(name: &str, kept: Result<(), String>) -> anyhow::Result<()> {
    kept.map_err(|why| anyhow::anyhow!("{name} {why}"))
}

/// Timed runs of `--bench` (each a whole experiment; their speeds are kept).
const MAX_BENCH_RUNS: u64 = 1000;

/// The load flags' values, each by its rule; the error names the flag.
fn check_load(args: &SimArgs) -> anyhow::Result<()> {
    let lanes = |c: usize| rule::count(c as u64, crate::workload::MAX_LANES);
    if let Some(c) = args.concurrency {
        flag("--concurrency", lanes(c))?;
    }
    for &c in &args.sweep {
        flag("--sweep", lanes(c))?;
    }
    if let Some(r) = args.rate_scale {
        flag("--rate-scale", rule::above_zero(r))?;
    }
    if args.trace.is_none() && args.replay.is_none() {
        flag("--synthetic-sessions", lanes(args.synthetic_sessions))?;
    }
    if let Some(runs) = args.bench {
        flag("--bench", rule::count(runs as u64, MAX_BENCH_RUNS))?;
    }
    Ok(())
}

/// `--records`: one JSON line per measured request, arm by arm, seed by seed.
fn write_records(path: &Path, runs: &[ArmRecords]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let file =
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for run in runs {
        for r in &run.records {
            let mut line = serde_json::to_value(r)?;
            if let Some(o) = line.as_object_mut() {
                o.insert("arm".into(), run.arm.clone().into());
                o.insert("seed".into(), run.seed.into());
            }
            writeln!(out, "{line}").with_context(|| format!("writing {}", path.display()))?;
        }
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// The output files, checked before the run rather than after it: each one a file (not a
/// folder) in a folder that exists, and no two the same (the last written would replace the
/// others). With --sweep each name gets the load added, in the same folder.
fn check_outputs(args: &SimArgs) -> anyhow::Result<()> {
    let outputs = [
        ("--json", &args.json),
        ("--svg", &args.svg),
        ("--timeline", &args.timeline),
        ("--records", &args.records),
    ];
    let given: Vec<(&str, &PathBuf)> = outputs
        .iter()
        .filter_map(|(flag, p)| p.as_ref().map(|p| (*flag, p)))
        .collect();
    for (i, (flag, path)) in given.iter().enumerate() {
        if path.is_dir() {
            bail!("{flag} {}: is a folder; give a file name", path.display());
        }
        let folder = path.parent().filter(|f| !f.as_os_str().is_empty());
        if let Some(folder) = folder.filter(|f| !f.is_dir()) {
            bail!(
                "{flag} {}: the folder {} does not exist",
                path.display(),
                folder.display()
            );
        }
        if let Some((other, _)) = given[..i].iter().find(|(_, p)| p == path) {
            bail!(
                "{other} and {flag} name the same file {}: one would replace the other",
                path.display()
            );
        }
    }
    Ok(())
}

/// The flags that shape closed-loop lanes, where given: an open-loop load has no lanes.
fn lane_flags(args: &SimArgs) -> Option<&'static str> {
    if args.concurrency.is_some() {
        Some("--concurrency")
    } else if !args.sweep.is_empty() {
        Some("--sweep")
    } else if args.idle_cap.is_some() {
        Some("--idle-cap")
    } else if args.send_jitter.is_some() {
        Some("--send-jitter")
    } else {
        None
    }
}

/// Refuses the flags a trace's loop would ignore: lanes on Mooncake and Azure traces
/// (replayed open loop by their timestamps), a rate scale on Weka sessions (closed loop).
fn check_flags_fit(args: &SimArgs, format: TraceFormat) -> anyhow::Result<()> {
    match format {
        TraceFormat::Weka => {
            if args.rate_scale.is_some() {
                bail!(
                    "--rate-scale scales the timestamps of Mooncake and Azure traces; Weka \
                     and synthetic sessions run in closed-loop lanes (--concurrency sets the \
                     load)"
                );
            }
        }
        TraceFormat::Mooncake | TraceFormat::Azure => {
            if let Some(name) = lane_flags(args) {
                let trace = match format {
                    TraceFormat::Azure => "an Azure trace",
                    _ => "a Mooncake trace",
                };
                bail!(
                    "{name} applies to closed-loop lanes (Weka or synthetic sessions); \
                     {trace} is replayed open loop by its timestamps (--rate-scale scales \
                     its arrival rate)"
                );
            }
        }
    }
    Ok(())
}

/// `16 seeds` from seed 0; `seed 3` or `seeds 3-18` from another first seed.
fn seed_label(first: u64, n: u64) -> String {
    match (first, n) {
        (0, n) => count(n, "seed"),
        (f, 1) => format!("seed {f}"),
        (f, n) => format!("seeds {f}-{}", f.saturating_add(n - 1)),
    }
}

/// Whole seconds as they are, others to the millisecond.
fn seconds(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x}")
    } else {
        format!("{x:.3}")
    }
}

/// The plant as the header names it: the preset, or the config file, and the plant flags
/// that override it (`--output-scale` is stated on its own, as every scale but 1 is).
fn plant_label(args: &SimArgs, plant: &Plant, step_scale: Option<f64>) -> String {
    let mut text = match &args.config {
        Some(path) => format!("config {}", file_name(path)),
        None => format!("preset {}", plant.name),
    };
    let given: Vec<String> = [
        ("--idle-cap", args.idle_cap),
        ("--send-jitter", args.send_jitter),
        ("--jump-ms", args.jump_ms),
        ("--per-request-above-ms", args.per_request_above_ms),
    ]
    .iter()
    .filter_map(|(flag, v)| v.map(|v| format!("{flag} {}", rule::number(v))))
    .chain(step_scale.map(|f| match args.step_scale {
        Some(StepScaleArg::Auto) => format!("--step-scale auto: x{f:.4}"),
        _ => format!("--step-scale {}", rule::number(f)),
    }))
    .collect();
    if !given.is_empty() {
        text += &format!(" ({})", given.join(", "));
    }
    text
}

/// A file's name without its directories (the header stays short; the JSON keeps the path).
fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The workload for the JSON: `format` is `None` for a recording; `timed` is a trace of
/// timed requests (open loop).
fn workload_info(
    args: &SimArgs,
    format: Option<TraceFormat>,
    transform: &ContextTransform,
    timed: bool,
) -> WorkloadInfo {
    let shaped = !transform.is_identity();
    let (kind, path, sessions) = match (&args.replay, &args.trace) {
        (Some(p), _) => ("replay", Some(p), None),
        (None, Some(p)) => ("trace", Some(p), None),
        (None, None) => ("synthetic", None, Some(args.synthetic_sessions)),
    };
    WorkloadInfo {
        kind: kind.into(),
        path: path.map(|p| p.display().to_string()),
        format: format.filter(|_| path.is_some()),
        sessions,
        open_loop: timed || args.replay.is_some(),
        rate_scale: args.rate_scale,
        context_scale: args.context_scale.filter(|_| shaped),
        max_context: args.max_context.filter(|_| shaped),
    }
}

/// The workload as the header names it: `Weka trace FILE`, `Mooncake trace FILE at 2x
/// rate`, `recording FILE`, `synthetic workload (2000 sessions)`, and any context transform.
fn workload_label(info: &WorkloadInfo, transform: &ContextTransform) -> String {
    let file = info
        .path
        .as_deref()
        .map_or_else(String::new, |p| file_name(Path::new(p)));
    let mut text = match (info.kind.as_str(), info.format) {
        ("synthetic", _) => format!(
            "synthetic workload ({})",
            count(info.sessions.unwrap_or(0) as u64, "session")
        ),
        ("trace", Some(TraceFormat::Mooncake)) => format!("Mooncake trace {file}"),
        ("trace", Some(TraceFormat::Azure)) => format!("Azure trace {file}"),
        ("trace", _) => format!("Weka trace {file}"),
        _ => format!("recording {file}"),
    };
    if let Some(x) = info.rate_scale.filter(|&x| x != 1.0) {
        text += &format!(" at {x}x rate");
    }
    if !transform.is_identity() {
        text += &format!(" ({})", transform.describe());
    }
    text
}

fn svg_path(base: &Path, c: usize, sweep: bool) -> PathBuf {
    if !sweep {
        return base.to_path_buf();
    }
    let stem = base.file_stem().and_then(|s| s.to_str()).unwrap_or("ttft");
    base.with_file_name(format!("{stem}-c{c}.svg"))
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let mut arms = ArmSpec::parse_list(&args.arms)?;
    if arms.is_empty() {
        bail!("--arms names no arm: list one or more, e.g. control,tpot_budget=0.10");
    }
    check_load(&args)?;
    check_outputs(&args)?;
    let transform =
        ContextTransform::new(args.context_scale, args.max_context).map_err(|e| match e {
            TransformError::Scale(_) => anyhow::anyhow!("--context-scale: {e}"),
            TransformError::MaxContext => anyhow::anyhow!("--max-context: {e}"),
        })?;
    let recording = match &args.replay {
        Some(path) => {
            if !transform.is_identity() {
                bail!(
                    "--context-scale and --max-context transform traces; a recording holds \
                     the contexts as they were served"
                );
            }
            if let Some(name) = lane_flags(&args) {
                bail!(
                    "{name} applies to closed-loop lanes; a replay keeps the recorded arrivals \
                     (open loop)"
                );
            }
            Some(load_recording(path).context("--replay")?)
        }
        None => None,
    };
    let (duration, warmup, mut seeds) = run_shape(&args, recording.as_ref())?;
    let config = args.config.as_deref().map(Config::from_file).transpose()?;
    // A config's start for g and its gain rule are every tpot_budget arm's that names none of
    // its own (`g0=`, `g_from=`).
    let gain = config.as_ref().map(|c| &c.scheduler_config.gen_preemption);
    let config_g0 = gain.and_then(|p| p.initial_gain);
    let config_g_from = gain.and_then(|p| p.gain_from);
    for a in arms
        .iter_mut()
        .filter(|a| matches!(a.mode, ModeSpec::TpotBudget(_)))
    {
        a.g0 = a.g0.or(config_g0);
        a.gain_from = a.gain_from.or(config_g_from);
    }
    let (plant, admission) = match &config {
        Some(c) => from_config(c),
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
        flag("--target-window", rule::count(w as u64, MAX_ENTRIES))?;
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
        flag("--fixed-target", rule::seconds(x))?;
        admission.fixed_target = Some(x);
    }
    let mut plant = plant;
    if recording.is_some() && args.rate_scale.is_some() {
        bail!("--rate-scale applies to Mooncake and Azure traces; a replay keeps the recorded arrivals");
    }
    if let Some(x) = args.output_scale {
        // Past this a recorded output of a few thousand tokens no longer fits u32 tokens and
        // nothing completes; the reference's own scale is 2.6.
        const MAX_OUTPUT_SCALE: f64 = 100.0;
        if !(x.is_finite() && x > 0.0 && x <= MAX_OUTPUT_SCALE) {
            bail!(
                "--output-scale must be a finite number in (0, {MAX_OUTPUT_SCALE}], got {}",
                rule::number(x)
            );
        }
        plant.output_scale = x;
    }
    if let Some(x) = args.idle_cap {
        // Infinity is no cap: the run's duration still ends it.
        if x.is_nan() || x < 0.0 {
            bail!(
                "--idle-cap must be >= 0 (inf for no cap), got {}",
                rule::number(x)
            );
        }
        plant.idle_cap_s = x;
    }
    if let Some(ms) = args.send_jitter {
        flag(
            "--send-jitter",
            rule::finite_within(ms, 0.0, MAX_TIMING_UNIT),
        )?;
        plant.send_jitter_s = ms / 1e3;
    }
    for (name, value, field) in [
        ("--jump-ms", args.jump_ms, &mut plant.step.jump_ms),
        (
            "--per-request-above-ms",
            args.per_request_above_ms,
            &mut plant.step.per_request_above_ms,
        ),
    ] {
        if let Some(x) = value {
            // As the config bounds its timing fields.
            flag(name, rule::finite_within(x, 0.0, MAX_TIMING_UNIT))?;
            *field = x;
        }
    }
    let (workload, format) = match &recording {
        Some(r) => {
            sayln!(
                "replaying {}: {} recorded requests over {:.1} s, straight to the GEN worker",
                r.path.display(),
                r.records.len(),
                r.span_s()
            );
            let workload = Workload::Recorded(Arc::from(r.timed_requests()), r.completed().into());
            (workload, None)
        }
        None => workload(&args, &transform).map(|(w, format)| (w, Some(format)))?,
    };
    // A preset's output scale is fitted to the Weka traces' outputs (the synthetic sessions
    // are fitted to them too): it applies to them alone unless --output-scale is given. A
    // recording holds the lengths as served; Mooncake and Azure traces their own.
    let lengths_of = match format {
        Some(TraceFormat::Weka) => None,
        Some(TraceFormat::Mooncake) => Some("a Mooncake trace"),
        Some(TraceFormat::Azure) => Some("an Azure trace"),
        None => Some("a recording"),
    };
    if let (Some(what), None) = (lengths_of, args.output_scale) {
        if plant.output_scale != 1.0 {
            sayln!(
                "output scale 1: the preset's {} is fitted to the Weka traces' outputs, not \
                 {what}'s (--output-scale sets one)",
                plant.output_scale
            );
            plant.output_scale = 1.0;
        }
    }
    // The served run over the window, from a recording: what `--step-scale auto` fits and
    // what the replay check prints beside the simulated control.
    let served = recording
        .as_ref()
        .map(|rec| served::summarise(rec, warmup, duration));
    let step_scale = match args.step_scale {
        None => None,
        Some(StepScaleArg::Factor(x)) => {
            let (lo, hi) = calibrate::SCALE_RANGE;
            flag("--step-scale", rule::finite_within(x, lo, hi))?;
            Some(x)
        }
        Some(StepScaleArg::Auto) => {
            let Some(served) = &served else {
                bail!(
                    "--step-scale auto fits the step to a served run's TPOT: give the run's \
                     recording with --replay (or a factor, e.g. --step-scale 1.05)"
                );
            };
            if served.pauses > 0 {
                bail!(
                    "--step-scale auto fits the step to a control run, and this recording's \
                     window holds {} (a preemption arm's TPOT includes its pauses): fit on the \
                     control run of the same machine and pass its factor here, --step-scale F",
                    count(served.pauses, "pause")
                );
            }
            let base = RunSpec {
                plant: plant.clone(),
                admission,
                workload: workload.clone(),
                concurrency: 0,
                duration_s: duration,
                warmup_s: warmup,
                seed: args.first_seed,
            };
            let fit = auto_step_scale(&base, served.mean_tpot_ms)?;
            sayln!(
                "step x{:.4}: the replayed control's mean TPOT {:.3} ms, the served run's {:.3} \
                 ms ({} replays)",
                fit.factor,
                fit.tpot_ms,
                served.mean_tpot_ms,
                fit.runs
            );
            Some(fit.factor)
        }
    };
    if let Some(f) = step_scale {
        plant.step = plant.step.scaled(f);
    }
    let overrides = PlantOverrides {
        output_scale: args.output_scale,
        idle_cap_s: args.idle_cap,
        send_jitter_ms: args.send_jitter,
        jump_ms: args.jump_ms,
        per_request_above_ms: args.per_request_above_ms,
        step_scale,
    };
    // Timed arrivals are the same for every seed: one run unless more are asked for.
    if matches!(workload, Workload::Timed(..)) && args.seeds.is_none() {
        seeds = 1;
    }
    let plant_text = plant_label(&args, &plant, step_scale);
    let info = workload_info(
        &args,
        format,
        &transform,
        matches!(workload, Workload::Timed(..)),
    );
    let workload_text = workload_label(&info, &transform);
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // An open-loop load (a recording, or a trace of timed requests) has no lanes: its runs
    // and charts are headed by what drives them, not by a concurrency it ignores.
    let loads = if info.open_loop {
        vec![0] // open loop: no lanes
    } else if args.sweep.is_empty() {
        vec![args.concurrency.unwrap_or(DEFAULT_CONCURRENCY)]
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
                duration_s: duration,
                warmup_s: warmup,
                seed: args.first_seed,
            },
            arms: arms.clone(),
            seeds,
            threads,
            progress: !args.quiet,
        };
        if let Some(runs) = args.bench {
            return bench_command(&exp, runs);
        }
        let mut r =
            run_experiment_keeping(&exp, args.records.is_some()).map_err(anyhow::Error::msg)?;
        if let Some(base) = &args.records {
            let path = svg_path(base, c, loads.len() > 1);
            write_records(&path, &r.records)?;
            r.records.clear();
        }
        // The replay check: the served run beside the simulated control, and what that says
        // about the replay (a warning, so the JSON carries it too).
        let check = served.as_ref().and_then(|served| {
            let control = r.arms.iter().find(|a| a.name == "control")?;
            Some((
                served::table(served, control),
                served::replay_mismatch(served, control),
            ))
        });
        if let Some((_, Some(w))) = &check {
            r.warnings.push(w.clone());
        }
        r.config = args.config.as_ref().map(|p| p.display().to_string());
        r.plant_overrides = overrides;
        r.workload = Some(info.clone());
        let queue = match (r.target_window, r.ttft_percentile, r.fixed_target) {
            (_, _, Some(x)) => format!(", X fixed at {x} s"),
            (None, None, None) => String::new(),
            (w, q, None) => format!(
                ", X = p{} of the last {} waited TTFTs",
                q.unwrap_or(admission.ttft_percentile),
                w.unwrap_or(admission.target_window)
            ),
        };
        let load = load_label(&exp.base);
        let outputs = if plant.output_scale == 1.0 {
            String::new()
        } else {
            format!(", output scale {}", plant.output_scale)
        };
        let held = config_g_from.unwrap_or_default().note();
        let g_start = config_g0
            .filter(|_| {
                arms.iter()
                    .any(|a| matches!(a.mode, ModeSpec::TpotBudget(_)))
            })
            .map_or(String::new(), |g| {
                format!(", g starts at {g} (config){held}")
            });
        // Open loop, a seed changes nothing: every seed replays the same arrivals.
        let same_seeds = if info.open_loop && r.seeds > 1 {
            "; open loop: every seed replays the same arrivals, so the seeds are identical runs"
        } else {
            ""
        };
        sayln!(
            "\n== {load}, {workload_text}, {plant_text}{outputs}, {} x {} s (first {} s unmeasured{same_seeds}){queue}{g_start}{} ==",
            seed_label(r.first_seed, r.seeds),
            seconds(r.duration_s),
            seconds(r.warmup_s),
            r.target_output_tps
                .map_or(String::new(), |t| format!(", T = {t:.1} tok/s"))
        );
        say!("{}", report::arm_table(&r.arms));
        say!("{}", report::paired_table(&r.paired));
        if let Some((table, _)) = &check {
            say!("{table}");
        }
        for w in &r.warnings {
            sayln!("warning: {w}");
        }
        sayln!(
            "speed: {:.0} simulated s per wall s per core, {:.2e} events/s, {} in {:.1} s wall",
            r.speed.simulated_s_per_wall_s,
            r.speed.events_per_s,
            count(r.speed.runs as u64, "run"),
            r.speed.wall_s
        );
        if r.speed.arms.len() > 1 {
            let per_arm: Vec<String> = r
                .speed
                .arms
                .iter()
                .map(|a| format!("{} {:.0}", a.name, a.simulated_s_per_wall_s))
                .collect();
            sayln!("speed per arm: {}", per_arm.join(", "));
        }
        if let Some(base) = &args.svg {
            let path = svg_path(base, c, loads.len() > 1);
            let title = format!(
                "TTFT CDF, {load}, {plant_text}, {}",
                seed_label(r.first_seed, r.seeds)
            );
            let mut curves = r.ttft_samples.clone();
            if let Some(rec) = &recording {
                // The replay check as a picture: the served run's own curve beside the arms'.
                let served = served::window_ttfts(rec, warmup, duration);
                curves.insert(0, ("served (recorded)".to_string(), served));
            }
            std::fs::write(&path, svg::ttft_cdf(&title, &curves))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        match &args.timeline {
            Some(base) => {
                let path = svg_path(base, c, loads.len() > 1);
                let title = format!("Controller timeline, {load}, {plant_text}, seed 0");
                std::fs::write(&path, timeline::svg(&title, &r.timelines))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => r.timelines.clear(),
        }
        all.push(r);
    }
    if let Some(path) = &args.json {
        let text = if let (Some(served), [one]) = (&served, all.as_slice()) {
            serde_json::to_string_pretty(&ReplayJson {
                served,
                experiment: one,
            })?
        } else if all.len() == 1 {
            serde_json::to_string_pretty(&all[0])?
        } else {
            serde_json::to_string_pretty(&serde_json::json!({ "sweep": all }))?
        };
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--bench RUNS`: the experiment timed RUNS times.
fn bench_command(exp: &Experiment, runs: usize) -> anyhow::Result<()> {
    let arms: Vec<&str> = exp.arms.iter().map(|a| a.name.as_str()).collect();
    sayln!(
        "bench: {} x ({} x {} [{}] x {} s simulated, preset {}), {}",
        runs,
        count(exp.seeds, "seed"),
        count(arms.len() as u64, "arm"),
        arms.join(", "),
        seconds(exp.base.duration_s),
        exp.base.plant.name,
        count(exp.threads as u64, "thread")
    );
    let b = bench::bench(exp, runs, |i, s| sayln!("{}", bench::run_line(i, s)))
        .map_err(anyhow::Error::msg)?;
    say!("{}", bench::summary(&b));
    Ok(())
}

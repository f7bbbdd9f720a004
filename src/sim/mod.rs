//! The discrete-event simulator (SPEC §8): the real scheduling core (`WorkerCore`) against
//! a modelled plant in virtual time, driven by agentic traces. Arms are paired by seed
//! (each seed replays identical arrivals in every arm); seeds run in parallel.

pub mod arm;
pub mod bench;
pub mod calibrate;
pub mod cli;
pub mod engine;
pub mod fit;
pub mod fit_cli;
mod out;
pub mod pages;
pub mod plant;
pub mod presets;
pub mod report;
mod requests;
pub mod served;
pub mod svg;
pub mod timeline;
mod tokens;

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use arm::{ArmSpec, ModeSpec};
use engine::{ResolvedArm, RunResult, RunSpec};
use plant::Plant;
use report::{ArmSummary, Paired};

use crate::policy::admission::AdmissionParams;
use crate::policy::Mode;

/// T for `target_output_tps=auto`: the control's mean per-request output rate / 1.10.
pub const AUTO_TARGET_DIVISOR: f64 = 1.10;

/// How fast the simulation ran. Rates are per core: simulated seconds (or events, passes)
/// summed over runs, divided by the summed wall time of the runs themselves (each run's
/// replay and worker set-up included; trace loading and reporting excluded).
#[derive(Debug, Clone, Serialize)]
pub struct Speed {
    pub simulated_s_per_wall_s: f64,
    pub events_per_s: f64,
    pub passes_per_s: f64,
    pub runs: usize,
    /// Wall time of the whole experiment, all threads, from the first run's start.
    pub wall_s: f64,
    /// The same rates for each arm's runs alone.
    pub arms: Vec<ArmSpeed>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArmSpeed {
    pub name: String,
    pub simulated_s_per_wall_s: f64,
    pub passes_per_s: f64,
    pub runs: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExperimentResult {
    pub concurrency: usize,
    pub seeds: u64,
    /// The seeds ran `first_seed..first_seed + seeds` (`--first-seed`; 0 unless given).
    #[serde(skip_serializing_if = "is_zero")]
    pub first_seed: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub preset: String,
    /// `--config FILE` as given, where the plant and the admission settings came from
    /// (`preset` is then `config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The plant that ran: the preset's (or config's) models with any overrides applied.
    pub plant: Plant,
    /// The plant flags given on the command line, each with its value; absent when none was.
    #[serde(skip_serializing_if = "PlantOverrides::is_empty")]
    pub plant_overrides: PlantOverrides,
    /// What drove the runs (set by the command line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadInfo>,
    /// The recorded outputs' multiplier in effect (the reference preset's 2.6 on the Weka
    /// and synthetic sessions), present only where it is not 1, as in the run's header.
    #[serde(skip_serializing_if = "is_one")]
    pub output_scale: f64,
    /// X's window and percentile (SPEC §4.2), present only where they differ from the
    /// defaults (1000 waited TTFTs, p90).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_window: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_percentile: Option<f64>,
    /// An operator-set X (`--fixed-target`), present only when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed_target: Option<f64>,
    pub target_output_tps: Option<f64>,
    pub arms: Vec<ArmSummary>,
    pub paired: Vec<Paired>,
    pub speed: Speed,
    #[serde(skip)]
    pub ttft_samples: Vec<(String, Vec<f64>)>,
    /// Every measured request of every arm and seed, arm by arm, seed by seed (only from
    /// [`run_experiment_keeping`] asked to keep them: `sim --records`).
    #[serde(skip)]
    pub records: Vec<ArmRecords>,
    pub warnings: Vec<String>,
    /// Each arm's first-seed timeline, when the experiment asked for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<timeline::ArmTimeline>,
}

/// The plant flags a run was given (`--output-scale`, `--idle-cap`, `--send-jitter`,
/// `--jump-ms`, `--per-request-above-ms`), where given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PlantOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_scale: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_cap_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_jitter_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jump_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_request_above_ms: Option<f64>,
    /// `--step-scale`'s factor on every step term (`auto`'s as found).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_scale: Option<f64>,
}

impl PlantOverrides {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The workload of a run, as its JSON records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadInfo {
    /// `synthetic` (sessions fitted to the Weka traces), `trace` or `replay`.
    pub kind: String,
    /// The trace or recording file, as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The trace's format.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<crate::workload::TraceFormat>,
    /// The synthetic workload's sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<usize>,
    /// Open loop (arrivals at their timestamps, no lanes): every seed replays the same
    /// arrivals.
    pub open_loop: bool,
    /// `--rate-scale` of an open-loop trace, where given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_scale: Option<f64>,
    /// `--context-scale` and `--max-context`, where given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_scale: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context: Option<u32>,
}

pub struct Experiment {
    /// The run every arm and seed shares; its `seed` is the first of the `seeds` run.
    pub base: RunSpec,
    pub arms: Vec<ArmSpec>,
    pub seeds: u64,
    pub threads: usize,
    pub progress: bool,
}

fn run_jobs(
    exp: &Experiment,
    jobs: Vec<(usize, u64, ResolvedArm)>,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<(usize, u64, RunResult, f64)>, String> {
    let queue = Mutex::new(VecDeque::from(jobs));
    let results = Mutex::new(Vec::new());
    let failure = Mutex::new(None::<String>);
    std::thread::scope(|s| {
        for _ in 0..exp.threads.max(1) {
            s.spawn(|| loop {
                let job = queue.lock().ok().and_then(|mut q| q.pop_front());
                let Some((arm_idx, seed, arm)) = job else {
                    break;
                };
                let spec = RunSpec {
                    seed,
                    ..exp.base.clone()
                };
                let t0 = Instant::now();
                match engine::run(&spec, &arm, false) {
                    Ok(r) => {
                        let wall = t0.elapsed().as_secs_f64();
                        if let Ok(mut v) = results.lock() {
                            v.push((arm_idx, seed, r, wall));
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            *f = Some(e);
                        }
                    }
                }
                bar.inc(1);
            });
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    let mut v = results
        .into_inner()
        .map_err(|_| "a simulation thread panicked".to_string())?;
    v.sort_by_key(|(a, s, _, _)| (*a, *s));
    Ok(v)
}

/// What drives a run, as its header, chart titles and progress bar name it: closed-loop
/// lanes by their count (`c220`), an open-loop trace or a replayed recording by its loop
/// (they have no lanes).
pub fn load_label(spec: &RunSpec) -> String {
    match spec.workload {
        engine::Workload::Sessions(_) => format!("c{}", spec.concurrency),
        engine::Workload::Timed(..) => "open loop".into(),
        engine::Workload::Recorded(..) => "replay".into(),
    }
}

/// An open-loop run's last arrival in run time (arrivals are due relative to the first one,
/// divided by the rate scale), with that scale; `None` for closed-loop lanes or no requests.
fn last_arrival(spec: &RunSpec) -> Option<(f64, f64)> {
    let (requests, scale) = match &spec.workload {
        engine::Workload::Sessions(_) => return None,
        engine::Workload::Timed(t, scale) => (t, *scale),
        engine::Workload::Recorded(t, _) => (t, 1.0),
    };
    let (first, last) = requests
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |a, r| {
            (a.0.min(r.t), a.1.max(r.t))
        });
    let last_s = (last - first) / scale;
    last_s.is_finite().then_some((last_s, scale))
}

/// A warning when an open-loop trace's arrivals end well before the run does: throughputs
/// are over the whole measured window, so a long tail after the last arrival lowers them
/// (a 591 s Mooncake trace under the default 3600 s run reads at a sixth of its rate).
fn tail_warning(spec: &RunSpec) -> Option<String> {
    let (last_s, _) = last_arrival(spec)?;
    let (warmup, duration) = (spec.warmup_s, spec.duration_s);
    let after = (duration - last_s.max(warmup)) / (duration - warmup);
    (last_s >= warmup && after > 0.1).then(|| {
        format!(
            "the trace's last arrival is at {last_s:.1} s of the {duration} s run: throughputs \
             are over the whole measured window [{warmup}, {duration}) s, {:.0} % of it after \
             the last arrival; --duration sets the window's end",
            after * 100.0
        )
    })
}

/// A warning when the measured window holds no arrival, so that every metric is empty:
/// an open-loop trace (after its rate scale) that ends before the warm-up does, or else no
/// measured request in any of the control's runs. It names the flags that move the window.
fn window_warning(spec: &RunSpec, control: &[&RunResult]) -> Option<String> {
    let (warmup, duration) = (spec.warmup_s, spec.duration_s);
    if let Some((last_s, scale)) = last_arrival(spec) {
        if last_s < warmup {
            let (scaled, slower) = match &spec.workload {
                engine::Workload::Timed(..) if scale != 1.0 => (
                    format!(" at --rate-scale {scale}"),
                    ", or lower --rate-scale",
                ),
                engine::Workload::Timed(..) => (String::new(), ", or lower --rate-scale"),
                _ => (String::new(), ""),
            };
            // Just past the last arrival, so every request is measured (as a replay's default).
            let whole = last_s.floor() + 1.0;
            return Some(format!(
                "nothing is measured: the trace's last arrival{scaled} is at {last_s:.1} s, \
                 before the {warmup} s warm-up ends; lower --warmup below it (--warmup 0 \
                 --duration {whole} measures the whole trace){slower}"
            ));
        }
    }
    let arrived = control
        .iter()
        .any(|r| !r.records.is_empty() || r.unfinished > 0);
    (!arrived).then(|| {
        format!(
            "nothing is measured: no request arrived in the measured window [{warmup}, \
             {duration}) s; move it with --warmup and --duration"
        )
    })
}

/// `n` and its noun, the noun in the plural unless `n` is 1: `1 seed`, `16 seeds`.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// One arm's measured requests on one seed.
#[derive(Debug, Clone)]
pub struct ArmRecords {
    pub arm: String,
    pub seed: u64,
    pub records: Vec<engine::Record>,
}

/// Run every arm for every seed; the control first (it fixes T for `target_output_tps=auto`).
pub fn run_experiment(exp: &Experiment) -> Result<ExperimentResult, String> {
    run_experiment_keeping(exp, false)
}

/// [`run_experiment`], keeping every measured request in `records` when `keep_records`.
pub fn run_experiment_keeping(
    exp: &Experiment,
    keep_records: bool,
) -> Result<ExperimentResult, String> {
    let mut arms = exp.arms.clone();
    if !arms.iter().any(ArmSpec::is_control) {
        arms.insert(0, ArmSpec::control());
    }
    let control_idx = arms.iter().position(ArmSpec::is_control).unwrap_or(0);
    let total = arms.len() as u64 * exp.seeds;
    let bar = if exp.progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} sim {msg} [{bar:30}] {pos}/{len} runs, {elapsed} (eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(load_label(&exp.base));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let wall0 = Instant::now();
    let control_arm = ResolvedArm {
        spec: arms[control_idx].clone(),
        mode: Mode::Off,
    };
    let seeds = exp.base.seed..exp.base.seed.saturating_add(exp.seeds);
    let control_jobs = seeds
        .clone()
        .map(|s| (control_idx, s, control_arm.clone()))
        .collect();
    let mut results = run_jobs(exp, control_jobs, &bar)?;

    let control_rates: Vec<f64> = results
        .iter()
        .flat_map(|(_, _, r, _)| r.records.iter().filter_map(report::output_rate))
        .collect();
    let auto_t = (!control_rates.is_empty()).then(|| {
        control_rates.iter().sum::<f64>() / control_rates.len() as f64 / AUTO_TARGET_DIVISOR
    });

    let mut jobs = Vec::new();
    let mut arm_targets = vec![None; arms.len()];
    for (i, a) in arms.iter().enumerate() {
        if i == control_idx {
            continue;
        }
        let mode = match a.mode {
            ModeSpec::Off => Mode::Off,
            ModeSpec::TpotBudget(b) => Mode::TpotBudget(b),
            ModeSpec::TargetOutputTps(t) => {
                let t = t.or(auto_t).ok_or_else(|| {
                    // Most often the window measured nothing: say so and how to move it.
                    let control: Vec<&RunResult> = results.iter().map(|(_, _, r, _)| r).collect();
                    let why = window_warning(&exp.base, &control).unwrap_or_else(|| {
                        "the control completed no request in the measured window".into()
                    });
                    format!("target_output_tps=auto is the control's output rate / 1.10: {why}")
                })?;
                arm_targets[i] = Some(t);
                Mode::TargetOutputTps(t)
            }
        };
        for s in seeds.clone() {
            jobs.push((
                i,
                s,
                ResolvedArm {
                    spec: a.clone(),
                    mode,
                },
            ));
        }
    }
    results.extend(run_jobs(exp, jobs, &bar)?);
    bar.finish_and_clear();
    let wall = wall0.elapsed().as_secs_f64();

    let window = exp.base.duration_s - exp.base.warmup_s;
    let target = arm_targets.iter().flatten().next().copied().or(auto_t);
    let runs_of = |i: usize| -> Vec<&RunResult> {
        results
            .iter()
            .filter(|(a, _, _, _)| *a == i)
            .map(|(_, _, r, _)| r)
            .collect()
    };
    let mut summaries = Vec::new();
    let mut paired = Vec::new();
    let mut samples = Vec::new();
    let mut warnings = Vec::new();
    for (i, a) in arms.iter().enumerate() {
        let runs = runs_of(i);
        summaries.push(report::summarise(
            &a.name,
            &runs,
            window,
            target,
            arm_targets[i],
        ));
        samples.push((
            a.name.clone(),
            runs.iter()
                .flat_map(|r| r.records.iter().map(|x| x.ttft_s))
                .collect(),
        ));
        if let Some(w) = runs.iter().find_map(|r| r.setup_warning.clone()) {
            warnings.push(format!("{}: {w}", a.name));
        }
        let aborts = summaries[i].kv_aborts;
        if aborts > 0 {
            warnings.push(format!(
                "{}: {} aborted: every running row waited for a KV page, so a stalled pass \
                 aborted its newest admission (these failed, and are not in the percentiles); \
                 the KV pool is too small for this load",
                a.name,
                count(aborts, "measured request")
            ));
        }
        if i != control_idx {
            paired.push(report::paired(
                &a.name,
                &arms[control_idx].name,
                &runs,
                &runs_of(control_idx),
                window,
            ));
        }
    }
    warnings.extend(window_warning(&exp.base, &runs_of(control_idx)));
    warnings.extend(tail_warning(&exp.base));
    let totals = |arm: Option<usize>| {
        results
            .iter()
            .filter(|(a, _, _, _)| arm.is_none_or(|i| i == *a))
            .fold((0.0, 0.0, 0u64, 0u64, 0usize), |acc, (_, _, r, w)| {
                (
                    acc.0 + r.simulated_s,
                    acc.1 + w,
                    acc.2 + r.events,
                    acc.3 + r.passes,
                    acc.4 + 1,
                )
            })
    };
    let (sim_s, job_wall, events, passes, _) = totals(None);
    let arm_speeds = arms
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let (sim_s, wall, _, passes, runs) = totals(Some(i));
            ArmSpeed {
                name: a.name.clone(),
                simulated_s_per_wall_s: sim_s / wall.max(1e-9),
                passes_per_s: passes as f64 / wall.max(1e-9),
                runs,
            }
        })
        .collect();
    // The summaries are made: the records move out rather than being copied.
    let mut records = Vec::new();
    if keep_records {
        let mut runs: Vec<_> = (results.iter_mut())
            .map(|(arm, seed, r, _)| (*arm, *seed, std::mem::take(&mut r.records)))
            .collect();
        runs.sort_by_key(|&(arm, seed, _)| (arm, seed));
        records = (runs.into_iter())
            .map(|(arm, seed, records)| ArmRecords {
                arm: arms[arm].name.clone(),
                seed,
                records,
            })
            .collect();
    }
    Ok(ExperimentResult {
        concurrency: exp.base.concurrency,
        seeds: exp.seeds,
        first_seed: exp.base.seed,
        duration_s: exp.base.duration_s,
        warmup_s: exp.base.warmup_s,
        preset: exp.base.plant.name.clone(),
        config: None,
        plant: exp.base.plant.clone(),
        plant_overrides: PlantOverrides::default(),
        workload: None,
        output_scale: exp.base.plant.output_scale,
        target_window: Some(exp.base.admission.target_window)
            .filter(|&w| w != AdmissionParams::default().target_window),
        ttft_percentile: Some(exp.base.admission.ttft_percentile)
            .filter(|&q| q != AdmissionParams::default().ttft_percentile),
        fixed_target: exp.base.admission.fixed_target,
        target_output_tps: target,
        arms: summaries,
        paired,
        speed: Speed {
            simulated_s_per_wall_s: sim_s / job_wall.max(1e-9),
            events_per_s: events as f64 / job_wall.max(1e-9),
            passes_per_s: passes as f64 / job_wall.max(1e-9),
            runs: results.len(),
            wall_s: wall,
            arms: arm_speeds,
        },
        ttft_samples: samples,
        records,
        warnings,
        timelines: arms
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let (_, seed, r, _) = results.iter().find(|(arm, _, _, _)| *arm == i)?;
                Some(timeline::ArmTimeline {
                    arm: a.name.clone(),
                    seed: *seed,
                    points: r.timeline.clone(),
                })
            })
            .collect(),
    })
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::workload::TimedRequest;

    fn spec(workload: engine::Workload) -> RunSpec {
        RunSpec {
            plant: presets::reference(),
            admission: AdmissionParams::default(),
            workload,
            concurrency: 220,
            duration_s: 3600.0,
            warmup_s: 300.0,
            seed: 0,
        }
    }

    fn timed(last_s: f64) -> Arc<[TimedRequest]> {
        [10.0, 10.0 + last_s]
            .iter()
            .map(|&t| TimedRequest {
                t,
                input_tokens: 100,
                output_tokens: 5,
                hash_ids: Default::default(),
                block_size: 0,
            })
            .collect()
    }

    #[test]
    fn a_run_is_labelled_by_what_drives_it_the_progress_bar_included() {
        let sessions = engine::Workload::Sessions(Arc::from(Vec::new()));
        assert_eq!(load_label(&spec(sessions)), "c220");
        let open = engine::Workload::Timed(timed(5.0), 1.0);
        assert_eq!(load_label(&spec(open)), "open loop");
        let replay = engine::Workload::Recorded(timed(5.0), Arc::from(vec![true, true]));
        assert_eq!(load_label(&spec(replay)), "replay");
    }

    #[test]
    fn one_is_singular() {
        assert_eq!(count(1, "seed"), "1 seed");
        assert_eq!(count(0, "seed"), "0 seeds");
        assert_eq!(count(16, "run"), "16 runs");
    }

    #[test]
    fn a_trace_that_ends_in_the_warmup_is_warned_of_after_its_rate_scale() {
        let measured = RunResult {
            unfinished: 1,
            ..RunResult::default()
        };
        // 591 s at twice the rate: 295.5 s, inside the 300 s warm-up.
        let w = window_warning(&spec(engine::Workload::Timed(timed(591.0), 2.0)), &[])
            .expect("a warning");
        assert!(w.contains("at --rate-scale 2 is at 295.5 s"), "{w}");
        assert!(w.contains("--warmup 0 --duration 296"), "{w}");
        // At its own rate it reaches past the warm-up, and a measured request silences the
        // general check.
        let spec1 = spec(engine::Workload::Timed(timed(591.0), 1.0));
        assert_eq!(window_warning(&spec1, &[&measured]), None);
        let w = window_warning(&spec1, &[&RunResult::default()]).expect("a warning");
        assert!(
            w.contains("no request arrived in the measured window [300, 3600) s"),
            "{w}"
        );
        // Measured, but the window runs far past the last arrival (591 s of 3600 s).
        let w = tail_warning(&spec1).expect("a warning");
        assert!(w.contains("at 591.0 s of the 3600 s run"), "{w}");
        assert!(w.contains("91 % of it after the last arrival"), "{w}");
        let ends_near = RunSpec {
            duration_s: 620.0,
            ..spec(engine::Workload::Timed(timed(591.0), 1.0))
        };
        assert_eq!(tail_warning(&ends_near), None);
        // A recording has no rate scale to lower.
        let replay = engine::Workload::Recorded(timed(5.0), Arc::from(vec![true, true]));
        let w = window_warning(&spec(replay), &[]).expect("a warning");
        assert!(!w.contains("--rate-scale"), "{w}");
    }
}

//! Summaries per arm, paired deltas against the control by seed, tables and JSON.

use serde::Serialize;

use super::engine::{Record, RunResult};

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

fn opt_mean(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = v.flatten().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// A request's output rate, tokens/s, accepted draft tokens included.
pub fn output_rate(r: &Record) -> Option<f64> {
    (r.output_tokens > 1 && r.decode_s > 0.0).then(|| (r.output_tokens - 1) as f64 / r.decode_s)
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ArmSummary {
    pub name: String,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    pub ttft_mean_s: f64,
    /// Of the mean TTFT: the wait for a slot and the context's arrival (`Record`).
    pub mean_queue_s: f64,
    pub mean_context_s: f64,
    pub mean_tpot_ms: f64,
    pub e2e_p90_s: f64,
    pub total_tps: f64,
    pub output_tps: f64,
    pub below_target_share: Option<f64>,
    pub pauses: u64,
    pub resumes: u64,
    pub forced_resumes: u64,
    pub displaced: u64,
    pub requests: usize,
    pub unfinished: u64,
    /// Measured requests aborted by a stalled KV pool (`policy::kv_stall`): failed, not in
    /// the percentiles.
    pub kv_aborts: u64,
    pub mean_batch: f64,
    pub mean_step_ms: f64,
    pub target_output_tps: Option<f64>,
    pub mean_paused: f64,
    /// Controller state at the end of the runs (mean over seeds).
    pub final_g: Option<f64>,
    pub final_x_s: Option<f64>,
    pub final_d_s: Option<f64>,
}

/// Summarise runs (one per seed, pooled) of one arm over a window of `window_s` seconds.
pub fn summarise(
    name: &str,
    runs: &[&RunResult],
    window_s: f64,
    target: Option<f64>,
    arm_target: Option<f64>,
) -> ArmSummary {
    let records: Vec<&Record> = runs.iter().flat_map(|r| r.records.iter()).collect();
    let mut ttft: Vec<f64> = records.iter().map(|r| r.ttft_s).collect();
    ttft.sort_by(f64::total_cmp);
    let mut e2e: Vec<f64> = records.iter().map(|r| r.e2e_s).collect();
    e2e.sort_by(f64::total_cmp);
    let seeds = runs.len().max(1) as f64;
    let tokens: u64 = records
        .iter()
        .map(|r| r.input_tokens as u64 + r.output_tokens as u64)
        .sum();
    let out_tokens: u64 = records.iter().map(|r| r.output_tokens as u64).sum();
    let below = target.map(|t| {
        let rated: Vec<f64> = records.iter().filter_map(|r| output_rate(r)).collect();
        rated.iter().filter(|&&x| x < t).count() as f64 / rated.len().max(1) as f64
    });
    ArmSummary {
        name: name.to_string(),
        ttft_p50_s: percentile(&ttft, 50.0),
        ttft_p90_s: percentile(&ttft, 90.0),
        ttft_p99_s: percentile(&ttft, 99.0),
        ttft_mean_s: mean(ttft.iter().copied()),
        mean_queue_s: mean(records.iter().map(|r| r.queue_s)),
        mean_context_s: mean(records.iter().map(|r| r.context_s)),
        mean_tpot_ms: 1e3 * mean(records.iter().filter_map(|r| r.tpot_s)),
        e2e_p90_s: percentile(&e2e, 90.0),
        total_tps: tokens as f64 / (window_s * seeds),
        output_tps: out_tokens as f64 / (window_s * seeds),
        below_target_share: below,
        pauses: runs.iter().map(|r| r.pauses).sum(),
        resumes: runs.iter().map(|r| r.resumes).sum(),
        forced_resumes: runs.iter().map(|r| r.forced_resumes).sum(),
        displaced: runs.iter().map(|r| r.displaced).sum(),
        requests: records.len(),
        unfinished: runs.iter().map(|r| r.unfinished).sum(),
        kv_aborts: runs.iter().map(|r| r.kv_aborts).sum(),
        mean_batch: mean(runs.iter().map(|r| r.mean_batch)),
        mean_step_ms: 1e3 * mean(runs.iter().map(|r| r.mean_step_s)),
        target_output_tps: arm_target,
        mean_paused: mean(runs.iter().map(|r| r.mean_paused)),
        final_g: opt_mean(runs.iter().map(|r| r.final_g)),
        final_x_s: opt_mean(runs.iter().map(|r| r.final_x_s)),
        final_d_s: opt_mean(runs.iter().map(|r| r.final_d_s)),
    }
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// Over the seeds that have a value (a seed whose arm completed no measured request has
    /// none); NaN throughout when none has.
    pub fn of(v: &[f64]) -> Spread {
        let has = || v.iter().copied().filter(|x| x.is_finite());
        if has().next().is_none() {
            return Spread {
                mean: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        Spread {
            mean: mean(has()),
            min: has().fold(f64::INFINITY, f64::min),
            max: has().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Paired {
    pub arm: String,
    pub vs: String,
    pub delta_ttft_p90_s: Spread,
    pub delta_ttft_p50_s: Spread,
    pub delta_mean_tpot_pct: Spread,
    pub delta_total_tps_pct: Spread,
    pub delta_e2e_p90_s: Spread,
}

/// Per-seed deltas of `arm` against `control` (same seed = identical arrivals).
pub fn paired(
    arm: &str,
    control: &str,
    arm_runs: &[&RunResult],
    control_runs: &[&RunResult],
    window_s: f64,
) -> Paired {
    let mut d90 = Vec::new();
    let mut d50 = Vec::new();
    let mut dtpot = Vec::new();
    let mut dtps = Vec::new();
    let mut de2e = Vec::new();
    for (a, c) in arm_runs.iter().zip(control_runs) {
        let sa = summarise(arm, &[a], window_s, None, None);
        let sc = summarise(control, &[c], window_s, None, None);
        d90.push(sa.ttft_p90_s - sc.ttft_p90_s);
        d50.push(sa.ttft_p50_s - sc.ttft_p50_s);
        dtpot.push(100.0 * (sa.mean_tpot_ms / sc.mean_tpot_ms - 1.0));
        dtps.push(100.0 * (sa.total_tps / sc.total_tps - 1.0));
        de2e.push(sa.e2e_p90_s - sc.e2e_p90_s);
    }
    Paired {
        arm: arm.to_string(),
        vs: control.to_string(),
        delta_ttft_p90_s: Spread::of(&d90),
        delta_ttft_p50_s: Spread::of(&d50),
        delta_mean_tpot_pct: Spread::of(&dtpot),
        delta_total_tps_pct: Spread::of(&dtps),
        delta_e2e_p90_s: Spread::of(&de2e),
    }
}

/// `x` to `prec` decimals, or `-` where there is no value (an arm that completed no
/// measured request has no latency).
fn num(x: f64, prec: usize) -> String {
    if x.is_finite() {
        format!("{x:.prec$}")
    } else {
        "-".into()
    }
}

fn opt_pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x))
}

/// The per-arm table.
pub fn arm_table(arms: &[ArmSummary]) -> String {
    let mut s = format!(
        "{:<34} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>8} {:>7} {:>7} {:>7} {:>6} {:>6}\n",
        "arm",
        "ttft50",
        "ttft90",
        "ttft99",
        "mean",
        "tpot_ms",
        "e2e90",
        "total_tps",
        "out_tps",
        "<T",
        "pauses",
        "resumes",
        "forced",
        "batch"
    );
    for a in arms {
        s += &format!(
            "{:<34} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>8} {:>7} {:>7} {:>7} {:>6} {:>6}\n",
            a.name,
            num(a.ttft_p50_s, 2),
            num(a.ttft_p90_s, 2),
            num(a.ttft_p99_s, 2),
            num(a.ttft_mean_s, 2),
            num(a.mean_tpot_ms, 2),
            num(a.e2e_p90_s, 2),
            num(a.total_tps, 0),
            num(a.output_tps, 1),
            opt_pct(a.below_target_share),
            a.pauses,
            a.resumes,
            a.forced_resumes,
            num(a.mean_batch, 1)
        );
    }
    s
}

/// The paired-delta table (mean [min, max] across seeds); nothing when no arm is paired
/// with the control (the control alone).
pub fn paired_table(p: &[Paired]) -> String {
    if p.is_empty() {
        return String::new();
    }
    let f = |x: &Spread, unit: &str| {
        if x.mean.is_finite() {
            format!("{:+.2}{unit} [{:+.2}, {:+.2}]", x.mean, x.min, x.max)
        } else {
            "- (no completions)".into()
        }
    };
    let mut s = format!(
        "{:<34} {:<28} {:<28} {:<28}\n",
        "arm vs control (per seed)", "Δ TTFT p90", "Δ mean TPOT", "Δ total tps"
    );
    for x in p {
        s += &format!(
            "{:<34} {:<28} {:<28} {:<28}\n",
            x.arm,
            f(&x.delta_ttft_p90_s, " s"),
            f(&x.delta_mean_tpot_pct, "%"),
            f(&x.delta_total_tps_pct, "%")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paired_table_is_left_out_when_no_arm_is_paired() {
        assert_eq!(paired_table(&[]), "");
        let nan = Spread::of(&[]);
        let one = Paired {
            arm: "tpot_budget=0.10".into(),
            vs: "control".into(),
            delta_ttft_p90_s: nan,
            delta_ttft_p50_s: nan,
            delta_mean_tpot_pct: nan,
            delta_total_tps_pct: nan,
            delta_e2e_p90_s: nan,
        };
        let table = paired_table(&[one]);
        assert!(table.starts_with("arm vs control (per seed)"), "{table}");
        assert!(table.contains("tpot_budget=0.10"), "{table}");
    }
}

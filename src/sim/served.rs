//! What a served run measured, read from its recording (`serve --record`), summarised the way
//! the simulator summarises an arm so `sim --replay` can print the two side by side.

use serde::Serialize;

use super::report::{percentile, ArmSummary};
use crate::workload::recording::{Outcome, Recording, ServedRecord};

/// The served run over the replay's measurement window: requests that arrived in
/// `[first arrival + warmup, first arrival + duration)`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServedSummary {
    pub file: String,
    pub run_start_unix: f64,
    /// Every recorded request, and how those in the window ended.
    pub recorded: usize,
    pub completed: usize,
    pub cancelled: usize,
    pub failed: usize,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    pub ttft_mean_s: f64,
    /// Of the mean TTFT: the wait for a slot and the context's arrival, where the recording
    /// stamps admission and KV-ready times on every completed request (else absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_queue_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_context_s: Option<f64>,
    pub mean_tpot_ms: f64,
    pub e2e_p90_s: f64,
    /// Context plus output tokens of the completed requests, per second of window.
    pub total_tps: f64,
    pub output_tps: f64,
    /// Pauses of the requests in the window.
    pub pauses: u64,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The requests of `rec` that arrived in the window `[warmup_s, duration_s)` after its first
/// arrival.
fn in_window(rec: &Recording, warmup_s: f64, duration_s: f64) -> Vec<&ServedRecord> {
    let t0 = rec.first_arrival_s();
    rec.records
        .iter()
        .filter(|r| {
            let t = r.arrival_s - t0;
            t >= warmup_s && t < duration_s
        })
        .collect()
}

/// The TTFTs of the completed requests among `records`, sorted.
fn completed_ttfts<'a>(records: impl IntoIterator<Item = &'a ServedRecord>) -> Vec<f64> {
    let mut ttft: Vec<f64> = records
        .into_iter()
        .filter(|r| r.outcome == Outcome::Completed)
        .filter_map(ServedRecord::ttft_s)
        .collect();
    ttft.sort_by(f64::total_cmp);
    ttft
}

/// The TTFTs of the window's completed requests, sorted: the served curve beside the
/// simulated ones in `sim --replay --svg`.
pub fn window_ttfts(rec: &Recording, warmup_s: f64, duration_s: f64) -> Vec<f64> {
    completed_ttfts(in_window(rec, warmup_s, duration_s))
}

/// Summarises `rec` over the window `[warmup_s, duration_s)` after its first arrival.
pub fn summarise(rec: &Recording, warmup_s: f64, duration_s: f64) -> ServedSummary {
    let in_window = in_window(rec, warmup_s, duration_s);
    let done: Vec<_> = in_window
        .iter()
        .filter(|r| r.outcome == Outcome::Completed)
        .collect();
    let count = |o: Outcome| in_window.iter().filter(|r| r.outcome == o).count();
    let ttft = completed_ttfts(in_window.iter().copied());
    let mut e2e: Vec<f64> = done.iter().map(|r| r.finish_s - r.arrival_s).collect();
    e2e.sort_by(f64::total_cmp);
    let tpot: Vec<f64> = done.iter().filter_map(|r| r.tpot_s()).collect();
    let window = (duration_s - warmup_s).max(1e-9);
    let out_tokens: u64 = done.iter().map(|r| u64::from(r.output_tokens)).sum();
    let in_tokens: u64 = done.iter().map(|r| u64::from(r.context_tokens)).sum();
    let stamps: Option<Vec<(f64, f64)>> = done
        .iter()
        .map(|r| Some((r.admitted_s? - r.arrival_s, r.kv_ready_s? - r.admitted_s?)))
        .collect();
    let stamps = stamps.filter(|s| !s.is_empty());
    let split = |f: fn(&(f64, f64)) -> f64| {
        stamps
            .as_ref()
            .map(|s| mean(&s.iter().map(f).collect::<Vec<_>>()))
    };
    ServedSummary {
        file: rec.path.display().to_string(),
        run_start_unix: rec.run_start_unix,
        recorded: rec.records.len(),
        completed: done.len(),
        cancelled: count(Outcome::Cancelled),
        failed: count(Outcome::Failed),
        ttft_p50_s: percentile(&ttft, 50.0),
        ttft_p90_s: percentile(&ttft, 90.0),
        ttft_p99_s: percentile(&ttft, 99.0),
        ttft_mean_s: mean(&ttft),
        mean_queue_s: split(|s| s.0),
        mean_context_s: split(|s| s.1),
        mean_tpot_ms: 1e3 * mean(&tpot),
        e2e_p90_s: percentile(&e2e, 90.0),
        total_tps: (in_tokens + out_tokens) as f64 / window,
        output_tps: out_tokens as f64 / window,
        pauses: in_window.iter().map(|r| u64::from(r.pauses)).sum(),
    }
}

/// The served run beside the simulated arm replayed under the serving setting, with the
/// simulator's error on each.
pub fn table(served: &ServedSummary, sim: &ArmSummary) -> String {
    let mut s = format!(
        "{:<34} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>7} {:>9}\n",
        "replay check",
        "ttft50",
        "ttft90",
        "ttft99",
        "mean",
        "tpot_ms",
        "e2e90",
        "total_tps",
        "pauses",
        "requests"
    );
    let row = |name: &str, v: [f64; 7], pauses: u64, n: usize| {
        format!(
            "{name:<34} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>8.2} {:>8.2} {:>9.0} {pauses:>7} {n:>9}\n",
            v[0], v[1], v[2], v[3], v[4], v[5], v[6]
        )
    };
    let a = [
        served.ttft_p50_s,
        served.ttft_p90_s,
        served.ttft_p99_s,
        served.ttft_mean_s,
        served.mean_tpot_ms,
        served.e2e_p90_s,
        served.total_tps,
    ];
    let b = [
        sim.ttft_p50_s,
        sim.ttft_p90_s,
        sim.ttft_p99_s,
        sim.ttft_mean_s,
        sim.mean_tpot_ms,
        sim.e2e_p90_s,
        sim.total_tps,
    ];
    s += &row("served (recorded)", a, served.pauses, served.completed);
    s += &row(
        &format!("simulated {}", sim.name),
        b,
        sim.pauses,
        sim.requests,
    );
    let err: Vec<String> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| {
            if *x > 0.0 && x.is_finite() && y.is_finite() {
                format!("{:+.0}%", 100.0 * (y / x - 1.0))
            } else {
                "-".into()
            }
        })
        .collect();
    s += &format!(
        "{:<34} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9}\n",
        "simulated vs served", err[0], err[1], err[2], err[3], err[4], err[5], err[6]
    );
    if let (Some(q), Some(c)) = (served.mean_queue_s, served.mean_context_s) {
        s += &ttft_split(
            (q, c, served.ttft_mean_s),
            (sim.mean_queue_s, sim.mean_context_s, sim.ttft_mean_s),
            &sim.name,
        );
    }
    s
}

/// The largest share by which the replayed control's mean TPOT may differ from a served
/// control's before the check says the plant's step is not the served run's.
const STEP_TOLERANCE: f64 = 0.05;
/// The share, and the seconds, by which the replayed control's TTFT p90 may differ from a
/// served control's, with the step matching, before the check says the replay does not queue
/// as the run did. Measured: experiment-5's H200 control replayed on its fitted step came
/// within 1 % at p90, and the H200 runs of docs/results.md §4.4 each on its own arm within 9 %
/// in 15 of 16; the H100 controls of two closed loops at c320 came 21 % and 48 % long (+1.65
/// and +3.47 s, §7.2–7.3). The seconds keep a run without a queue, whose TTFT is its transfer
/// and first pass, from reading as one.
const QUEUE_TOLERANCE: f64 = 0.20;
const QUEUE_TOLERANCE_S: f64 = 1.0;

/// What the replay check of a control recording says about the replay itself, when the
/// simulated control is far from the served run: its step off by more than
/// [`STEP_TOLERANCE`], or, the step matching, its TTFT p90 off by [`QUEUE_TOLERANCE`] and
/// [`QUEUE_TOLERANCE_S`] or more. `None` for a recording that paused (its TPOT holds pauses
/// and its queue their gain, so it differs from a control by design) or when the two agree.
pub fn replay_mismatch(served: &ServedSummary, sim: &ArmSummary) -> Option<String> {
    if served.pauses > 0 || served.completed == 0 {
        return None;
    }
    let off = |s: f64, m: f64| (s > 0.0 && m.is_finite()).then(|| m / s - 1.0);
    let step = off(served.mean_tpot_ms, sim.mean_tpot_ms)?;
    if step.abs() > STEP_TOLERANCE {
        return Some(format!(
            "the replayed control decodes at {:.2} ms a token against the served run's {:.2} \
             ({:+.0}%): the plant's step is not the served run's, so neither are its queues; \
             fit it with --step-scale auto (docs/replay.md)",
            sim.mean_tpot_ms,
            served.mean_tpot_ms,
            100.0 * step
        ));
    }
    let queue = off(served.ttft_p90_s, sim.ttft_p90_s)?;
    let gap_s = (sim.ttft_p90_s - served.ttft_p90_s).abs();
    (queue.abs() >= QUEUE_TOLERANCE && gap_s >= QUEUE_TOLERANCE_S).then(|| {
        format!(
            "the replayed control's TTFT p90 is {:.2} s against the served run's {:.2} s \
             ({:+.0}%) on the served run's step (TPOT within {:.0}%): the recorded arrivals, \
             fed open loop, queue differently here than they did when served. A closed-loop \
             run near saturation, whose lanes waited on completions, cannot be replayed so; \
             its prediction is the closed-loop twin (--trace ... --concurrency N --first-seed \
             K, docs/replay.md), and these arms' deltas stand on the replay's queue",
            sim.ttft_p90_s,
            served.ttft_p90_s,
            100.0 * queue,
            100.0 * STEP_TOLERANCE
        )
    })
}

/// Where the mean TTFT goes, served beside simulated: the wait for a slot, the context's
/// arrival, and the rest (the wait for the pass that first schedules the request).
fn ttft_split(served: (f64, f64, f64), sim: (f64, f64, f64), sim_name: &str) -> String {
    let mut s = format!(
        "{:<34} {:>7} {:>7} {:>10}\n",
        "mean TTFT split (s)", "queue", "context", "first pass"
    );
    for (name, (q, c, t)) in [
        ("served (recorded)".to_string(), served),
        (format!("simulated {sim_name}"), sim),
    ] {
        s += &format!("{name:<34} {q:>7.3} {c:>7.3} {:>10.3}\n", t - q - c);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn rec(id: u64, arrival: f64, ttft: f64, out: u32, outcome: Outcome) -> ServedRecord {
        ServedRecord {
            id,
            run_start_unix: 0.0,
            arrival_s: arrival,
            context_tokens: 1000,
            max_tokens: out,
            output_tokens: out,
            admitted_s: None,
            kv_ready_s: None,
            first_token_s: Some(arrival + ttft),
            finish_s: arrival + ttft + 0.01 * f64::from(out - 1),
            pauses: 1,
            outcome,
            error: None,
        }
    }

    #[test]
    fn the_window_starts_after_the_warmup_and_only_completions_count_for_latency() {
        let r = Recording {
            path: PathBuf::from("r.jsonl"),
            run_start_unix: 0.0,
            records: vec![
                rec(0, 5.0, 100.0, 11, Outcome::Completed), // before the window
                rec(1, 15.0, 1.0, 11, Outcome::Completed),
                rec(2, 16.0, 3.0, 21, Outcome::Completed),
                rec(3, 17.0, 9.0, 11, Outcome::Cancelled),
                rec(4, 40.0, 7.0, 11, Outcome::Completed), // after it
            ],
        };
        let s = summarise(&r, 10.0, 30.0);
        assert_eq!(
            (s.recorded, s.completed, s.cancelled, s.failed),
            (5, 2, 1, 0)
        );
        assert_eq!((s.ttft_p50_s, s.ttft_p90_s, s.ttft_mean_s), (1.0, 3.0, 2.0));
        assert!((s.mean_tpot_ms - 10.0).abs() < 1e-9);
        assert_eq!(s.pauses, 3);
        assert_eq!(s.output_tps, 32.0 / 20.0);
        assert_eq!((s.mean_queue_s, s.mean_context_s), (None, None));
    }

    /// A served control's summary with this TTFT p90 and mean TPOT, and a simulated control's.
    fn pair(
        served_p90: f64,
        served_tpot: f64,
        sim_p90: f64,
        sim_tpot: f64,
    ) -> (ServedSummary, ArmSummary) {
        let r = Recording {
            path: PathBuf::from("r.jsonl"),
            run_start_unix: 0.0,
            records: vec![rec(1, 1.0, 1.0, 11, Outcome::Completed)],
        };
        let mut served = summarise(&r, 0.0, 10.0);
        served.pauses = 0;
        served.ttft_p90_s = served_p90;
        served.mean_tpot_ms = served_tpot;
        let mut sim = crate::sim::report::summarise("control", &[], 10.0, None, None);
        sim.ttft_p90_s = sim_p90;
        sim.mean_tpot_ms = sim_tpot;
        (served, sim)
    }

    #[test]
    fn a_replay_that_queues_as_the_control_did_is_not_flagged() {
        // Experiment-5's control on its fitted step: p90 6.70 s against 6.63, TPOT equal.
        let (s, m) = pair(6.63, 23.02, 6.70, 23.02);
        assert_eq!(replay_mismatch(&s, &m), None);
        // No queue either way: 10 ms of transfer and first pass against 50 ms is no queue.
        let (s, m) = pair(0.05, 10.0, 0.01, 10.0);
        assert_eq!(replay_mismatch(&s, &m), None);
    }

    #[test]
    fn a_replay_on_the_served_step_that_queues_far_longer_names_the_closed_loop_twin() {
        // Experiment-4's control on the H100: 10.68 s against 7.21 at the same TPOT.
        let (s, m) = pair(7.21, 18.05, 10.68, 18.05);
        let w = replay_mismatch(&s, &m).expect("flagged");
        assert!(
            w.contains("10.68 s against the served run's 7.21 s (+48%)"),
            "{w}"
        );
        assert!(w.contains("closed-loop twin"), "{w}");
        // Far shorter is flagged too: the replay emptied a queue the run had.
        let (s, m) = pair(6.63, 23.02, 2.75, 23.02);
        assert!(replay_mismatch(&s, &m).expect("flagged").contains("(-59%)"));
    }

    #[test]
    fn a_replay_on_another_step_points_at_the_step_scale_first() {
        let (s, m) = pair(6.63, 23.02, 2.75, 21.10);
        let w = replay_mismatch(&s, &m).expect("flagged");
        assert!(
            w.contains("21.10 ms a token against the served run's 23.02 (-8%)"),
            "{w}"
        );
        assert!(w.contains("--step-scale auto"), "{w}");
    }

    #[test]
    fn a_recording_that_paused_is_never_flagged_against_the_control() {
        let (mut s, m) = pair(5.92, 20.21, 11.84, 18.06);
        s.pauses = 4504;
        assert_eq!(replay_mismatch(&s, &m), None);
    }

    #[test]
    fn stamped_recordings_split_the_mean_ttft_and_the_check_prints_the_split() {
        let stamped = |id, arrival: f64, queue: f64, context: f64| ServedRecord {
            admitted_s: Some(arrival + queue),
            kv_ready_s: Some(arrival + queue + context),
            ..rec(id, arrival, queue + context + 0.02, 11, Outcome::Completed)
        };
        let mut r = Recording {
            path: PathBuf::from("r.jsonl"),
            run_start_unix: 0.0,
            records: vec![stamped(1, 1.0, 0.5, 0.1), stamped(2, 2.0, 1.5, 0.3)],
        };
        let s = summarise(&r, 0.0, 10.0);
        assert!((s.mean_queue_s.unwrap() - 1.0).abs() < 1e-12);
        assert!((s.mean_context_s.unwrap() - 0.2).abs() < 1e-12);
        let sim = crate::sim::report::summarise("control", &[], 10.0, None, None);
        let t = table(&s, &sim);
        let served_split = t
            .lines()
            .skip_while(|l| !l.starts_with("mean TTFT split"))
            .nth(1)
            .unwrap();
        let cols: Vec<&str> = served_split.split_whitespace().collect();
        assert_eq!(cols[2..], ["1.000", "0.200", "0.020"], "{t}");
        // One completed request without stamps (an older server): no split.
        r.records.push(rec(3, 3.0, 1.0, 11, Outcome::Completed));
        let s = summarise(&r, 0.0, 10.0);
        assert_eq!((s.mean_queue_s, s.mean_context_s), (None, None));
        assert!(!table(&s, &sim).contains("mean TTFT split"));
    }
}

//! Under saturation the admission target X holds (SPEC §4.2): with the overdue tier, late
//! waiters come back within W₀ of X, so the waited TTFTs X is the percentile of do not
//! ratchet it down, and the `tpot_budget` controller keeps its authority (g off its clamps).
//! The v1 order (`guard_first`) is run beside it to show that the band is not loose enough
//! to let a drifting X through.
//!
//! Four simulated hours of the reference preset at c220 on the synthetic agentic workload
//! (fitted to the Weka traces, so no data file is needed), one seed per arm.

use std::sync::Arc;

use genslot::policy::admission::AdmissionParams;
use genslot::policy::{AdmissionPolicy, Mode};
use genslot::sim::arm::ArmSpec;
use genslot::sim::engine::{self, ResolvedArm, RunSpec, Workload};
use genslot::sim::presets;
use genslot::sim::timeline::TimelinePoint;
use genslot::workload::{SynthParams, SyntheticAgentic};

const HOURS_4: f64 = 4.0 * 3600.0;

fn run(arm_text: &str, mode: Mode) -> Vec<TimelinePoint> {
    let spec = RunSpec {
        plant: presets::reference(),
        admission: AdmissionParams::default(),
        workload: Workload::Sessions(Arc::from(
            SyntheticAgentic::new(SynthParams::default()).generate(2000, 0x5eed),
        )),
        concurrency: 220,
        duration_s: HOURS_4,
        warmup_s: 300.0,
        seed: 0,
    };
    let arm = ResolvedArm {
        spec: ArmSpec::parse(arm_text).expect("arm"),
        mode,
    };
    engine::run(&spec, &arm, false).expect("run").timeline
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// X over the run's second half: its median, the share of 30 s points within ±25 % of it,
/// and the largest deviation of a half-hour mean from it.
struct Band {
    median: f64,
    inside: f64,
    worst_half_hour: f64,
}

fn band(points: &[TimelinePoint]) -> Band {
    let half: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.t_s > HOURS_4 / 2.0)
        .filter_map(|p| p.x_s.map(|x| (p.t_s, x)))
        .collect();
    assert!(half.len() > 200, "X formed for {} points", half.len());
    let m = median(half.iter().map(|p| p.1).collect());
    let inside = half
        .iter()
        .filter(|p| (p.1 / m - 1.0).abs() <= 0.25)
        .count() as f64
        / half.len() as f64;
    let mut worst: f64 = 0.0;
    let mut start = HOURS_4 / 2.0;
    while start < HOURS_4 {
        let xs: Vec<f64> = half
            .iter()
            .filter(|p| p.0 > start && p.0 <= start + 1800.0)
            .map(|p| p.1)
            .collect();
        if !xs.is_empty() {
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            worst = worst.max((mean / m - 1.0).abs());
        }
        start += 1800.0;
    }
    Band {
        median: m,
        inside,
        worst_half_hour: worst,
    }
}

#[test]
fn x_holds_its_band_under_saturation_and_the_v1_order_does_not() {
    let auto = band(&run("control", Mode::Off));
    assert!(
        auto.inside >= 0.9 && auto.worst_half_hour <= 0.15,
        "control X: median {:.2} s, {:.0} % of points within ±25 %, worst half-hour mean {:.0} % off",
        auto.median,
        100.0 * auto.inside,
        100.0 * auto.worst_half_hour
    );
    let v1 = band(&run("order=guard_first", Mode::Off));
    assert!(
        v1.inside < 0.9 || v1.worst_half_hour > 0.15,
        "guard_first X stayed in the band: median {:.2} s, {:.0} %, {:.0} %",
        v1.median,
        100.0 * v1.inside,
        100.0 * v1.worst_half_hour
    );
    assert_eq!(
        ArmSpec::parse("order=guard_first").unwrap().order,
        Some(AdmissionPolicy::GuardFirst)
    );
}

#[test]
fn tpot_budget_keeps_g_off_its_clamps_under_saturation() {
    let points = run("tpot_budget=0.10", Mode::TpotBudget(0.10));
    let g: Vec<f64> = points.iter().filter_map(|p| p.g).collect();
    let clamped = g
        .iter()
        .filter(|&&g| g <= 0.25 + 1e-9 || g >= 2.0 - 1e-9)
        .count();
    assert!(
        (clamped as f64) <= 0.1 * g.len() as f64,
        "g on a clamp for {clamped} of {} points",
        g.len()
    );
    let b = band(&points);
    assert!(
        b.worst_half_hour <= 0.2,
        "X under tpot_budget drifts: median {:.2} s, worst half-hour mean {:.0} % off",
        b.median,
        100.0 * b.worst_half_hour
    );
}

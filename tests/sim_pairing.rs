//! The simulator's promises: the same seed gives the same results, byte for byte, and every
//! arm of a seed is offered the same workload.

use std::sync::Arc;

use genslot::policy::admission::AdmissionParams;
use genslot::policy::Mode;
use genslot::sim::arm::ArmSpec;
use genslot::sim::engine::{self, ResolvedArm, RunSpec, Workload};
use genslot::sim::{presets, run_experiment, Experiment};
use genslot::workload::{SynthParams, SyntheticAgentic, TimedRequest};

fn spec(workload: Workload) -> RunSpec {
    let mut plant = presets::reference();
    plant.max_batch_size = 8;
    plant.output_scale = 1.0;
    RunSpec {
        plant,
        admission: AdmissionParams {
            min_samples: 10,
            target_window: 100,
            ..AdmissionParams::default()
        },
        workload,
        concurrency: 24,
        duration_s: 400.0,
        warmup_s: 50.0,
        seed: 0,
    }
}

fn synthetic() -> Workload {
    Workload::Sessions(Arc::from(
        SyntheticAgentic::new(SynthParams::default()).generate(60, 11),
    ))
}

fn json_without_speed(exp: &Experiment) -> String {
    let r = run_experiment(exp).expect("runs");
    let mut v = serde_json::to_value(&r).expect("serialises");
    // Wall-clock speed is the one field that may differ between identical runs.
    v.as_object_mut().expect("object").remove("speed");
    serde_json::to_string(&v).expect("serialises")
}

#[test]
fn same_seed_gives_byte_identical_json() {
    let arms = ArmSpec::parse_list("control,tpot_budget=0.10,target_output_tps=auto").unwrap();
    let exp = |threads| Experiment {
        base: spec(synthetic()),
        arms: arms.clone(),
        seeds: 2,
        threads,
        progress: false,
    };
    let a = json_without_speed(&exp(2));
    let b = json_without_speed(&exp(1));
    assert_eq!(a, b);
    assert!(a.contains("\"pauses\""));
}

#[test]
fn every_arm_has_a_first_seed_timeline_every_thirty_simulated_seconds() {
    let arms = ArmSpec::parse_list("control,tpot_budget=0.10").unwrap();
    let r = run_experiment(&Experiment {
        base: spec(synthetic()),
        arms,
        seeds: 2,
        threads: 1,
        progress: false,
    })
    .unwrap();
    let names: Vec<&str> = r.timelines.iter().map(|t| t.arm.as_str()).collect();
    assert_eq!(names, ["control", "tpot_budget=0.10"]);
    for t in &r.timelines {
        assert_eq!(t.seed, 0);
        assert!(t.points.len() >= 10, "{} points", t.points.len());
        assert!(t.points.windows(2).all(|w| w[1].t_s > w[0].t_s));
        assert!(t.points.iter().all(|p| p.t_s % 30.0 == 0.0));
    }
    let paused: usize = r.timelines[1].points.iter().map(|p| p.paused).sum();
    let pauses: u64 = r.timelines[1].points.iter().map(|p| p.pauses).sum();
    assert!(pauses > 0 && paused > 0, "the preempting arm pauses");
    assert!(r.timelines[0]
        .points
        .iter()
        .all(|p| p.paused == 0 && p.g.is_none()));
}

fn arm(text: &str, mode: Mode) -> ResolvedArm {
    ResolvedArm {
        spec: ArmSpec::parse(text).unwrap(),
        mode,
    }
}

#[test]
fn arms_of_one_seed_see_identical_open_loop_arrivals() {
    let reqs: Vec<TimedRequest> = (0..400)
        .map(|i| TimedRequest {
            t: i as f64 * 0.5,
            input_tokens: 1000 + (i * 37 % 5000) as u32,
            output_tokens: 50 + (i * 13 % 300) as u32,
            hash_ids: Default::default(),
            block_size: 0,
        })
        .collect();
    let s = spec(Workload::Timed(Arc::from(reqs), 1.0));
    let control = engine::run(&s, &arm("control", Mode::Off), true).unwrap();
    let tpot = engine::run(&s, &arm("tpot_budget=0.1", Mode::TpotBudget(0.1)), true).unwrap();
    assert!(!control.issued.is_empty());
    assert_eq!(control.issued, tpot.issued);
}

#[test]
fn arms_of_one_seed_replay_the_same_sessions_from_the_same_start_points() {
    let s = spec(synthetic());
    let control = engine::run(&s, &arm("control", Mode::Off), true).unwrap();
    let tpot = engine::run(&s, &arm("tpot_budget=0.1", Mode::TpotBudget(0.1)), true).unwrap();
    // The first issue of every lane (its warm-up at its random start point) is identical.
    let firsts = |r: &engine::RunResult| {
        let mut v: Vec<_> = r
            .issued
            .iter()
            .filter(|i| i.send_at == 0.0)
            .copied()
            .collect();
        v.sort_by_key(|i| (i.lane, i.instance));
        v
    };
    assert_eq!(firsts(&control).len(), 24);
    assert_eq!(firsts(&control), firsts(&tpot));
    // Every replay instance is the same session in both arms (one shared, seeded deck).
    let deck = |r: &engine::RunResult| {
        let mut m: Vec<(u64, usize)> = r.issued.iter().map(|i| (i.instance, i.session)).collect();
        m.sort();
        m.dedup();
        m
    };
    let (a, b) = (deck(&control), deck(&tpot));
    let common = a.len().min(b.len());
    assert!(common > 24);
    assert_eq!(a[..common], b[..common]);
}

#[test]
fn a_malformed_trace_gives_an_error_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.jsonl");
    std::fs::write(
        &p,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5}\n{\"timestamp\": oops}\n",
    )
    .unwrap();
    let e = genslot::workload::load_trace(&p, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.jsonl") && e.contains('2'), "{e}");
}

#[test]
fn the_json_names_x_window_and_percentile_only_when_they_are_not_the_defaults() {
    let arms = ArmSpec::parse_list("control,tpot_budget=0.10").unwrap();
    let run = |admission: AdmissionParams| {
        let mut base = spec(synthetic());
        base.admission = admission;
        json_without_speed(&Experiment {
            base,
            arms: arms.clone(),
            seeds: 1,
            threads: 1,
            progress: false,
        })
    };
    let custom = run(AdmissionParams {
        min_samples: 10,
        target_window: 100,
        ttft_percentile: 95.0,
        ..AdmissionParams::default()
    });
    assert!(custom.contains("\"target_window\":100"), "{custom}");
    assert!(custom.contains("\"ttft_percentile\":95.0"), "{custom}");
    let default = run(AdmissionParams::default());
    assert!(!default.contains("target_window"));
    assert!(!default.contains("ttft_percentile"));
}

#[test]
fn sim_rejects_an_empty_x_window_and_a_percentile_out_of_range() {
    for (flag, value, says) in [
        ("--target-window", "0", "--target-window must be at least 1"),
        (
            "--ttft-percentile",
            "100",
            "--ttft-percentile must be in (0, 100)",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_genslot"))
            .args([
                "sim",
                "--seeds",
                "1",
                "--duration",
                "10",
                "--warmup",
                "0",
                "--quiet",
            ])
            .args([flag, value])
            .output()
            .expect("runs genslot");
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

/// `--first-seed K`: an experiment's seeds start at its base seed, so `K` alone is the run of
/// seed K (the lanes `loadgen --seed K` plays), not seed 0 again, and the JSON says so.
#[test]
fn an_experiment_from_a_first_seed_runs_that_seed() {
    let control = ArmSpec::parse_list("control").unwrap();
    let from = |seed: u64| {
        run_experiment(&Experiment {
            base: RunSpec {
                seed,
                ..spec(synthetic())
            },
            arms: control.clone(),
            seeds: 1,
            threads: 1,
            progress: false,
        })
        .expect("runs")
    };
    let arm = ResolvedArm {
        spec: control[0].clone(),
        mode: Mode::Off,
    };
    let base = spec(synthetic());
    let window = base.duration_s - base.warmup_s;
    // The run of that seed alone, summarised as the experiment summarises its control (the
    // share below T is against the experiment's own auto T).
    let alone = |seed: u64, like: &genslot::sim::report::ArmSummary| {
        let r = engine::run(
            &RunSpec {
                seed,
                ..base.clone()
            },
            &arm,
            false,
        )
        .expect("runs");
        let mut s = genslot::sim::report::summarise("control", &[&r], window, None, None);
        s.below_target_share = like.below_target_share;
        s
    };
    let (two, zero) = (from(2), from(0));
    assert_eq!(two.first_seed, 2);
    assert_eq!(two.arms[0], alone(2, &two.arms[0]));
    assert_eq!(zero.arms[0], alone(0, &zero.arms[0]));
    assert_ne!(
        two.arms[0], zero.arms[0],
        "seed 2 places other lanes than seed 0"
    );
    let json = serde_json::to_value(&two).unwrap();
    assert_eq!(json["first_seed"], 2);
    assert!(serde_json::to_value(&zero)
        .unwrap()
        .get("first_seed")
        .is_none());
}

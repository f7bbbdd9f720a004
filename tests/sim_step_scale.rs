//! `genslot sim --step-scale F|auto`: every step term times a factor, or (with --replay of a
//! control run) the factor at which the replayed control decodes at the served run's TPOT.

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::Output;

use cli_support::{genslot, ok};
use serde_json::Value;

fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("plant.yaml");
    std::fs::write(
        &path,
        "max_batch_size: 4\n\
         timing: { base_ms: 2.0, per_request_ms: 0.05, per_kv_token_ns: 1.0, \
         transfer_base_ms: 3.0, transfer_per_token_us: 5.0 }\n",
    )
    .unwrap();
    path
}

/// Ten requests 10 s apart, each decoding 20 tokens at `tpot_ms` after its first token: on
/// this plant (steps of a few ms) none overlaps another, so every step is a batch of one and
/// the replayed TPOT is proportional to the step. `paused` gives the first request a pause.
fn write_recording(dir: &Path, name: &str, tpot_ms: f64, paused: bool) -> PathBuf {
    let path = dir.join(name);
    let lines: Vec<String> = (0..10)
        .map(|i| {
            let arrival = 10.0 * f64::from(i);
            let first = arrival + 0.05;
            let finish = first + 19.0 * tpot_ms * 1e-3;
            let pauses = u32::from(paused && i == 0);
            format!(
                "{{\"id\":{i},\"run_start_unix\":1.0,\"arrival_s\":{arrival},\
                 \"context_tokens\":{},\"max_tokens\":20,\"output_tokens\":20,\
                 \"first_token_s\":{first},\"finish_s\":{finish},\"pauses\":{pauses},\
                 \"outcome\":\"completed\"}}",
                100 + 50 * i
            )
        })
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn replay(rec: &Path, cfg: &Path, json: &Path, step_scale: &str) -> Output {
    genslot()
        .args(["sim", "--quiet", "--arms", "control", "--warmup", "0"])
        .args(["--duration", "200", "--step-scale", step_scale, "--replay"])
        .arg(rec)
        .arg("--config")
        .arg(cfg)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run genslot sim")
}

fn control_tpot_ms(json: &Path) -> (f64, Value) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let tpot = v["arms"][0]["mean_tpot_ms"]
        .as_f64()
        .expect("control's mean TPOT");
    (tpot, v)
}

#[test]
fn a_factor_makes_every_step_that_many_times_as_long() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let rec = write_recording(dir.path(), "served.jsonl", 10.0, false);
    let (one, two) = (dir.path().join("one.json"), dir.path().join("two.json"));
    ok(&replay(&rec, &cfg, &one, "1"));
    let stdout = ok(&replay(&rec, &cfg, &two, "2"));
    let (t1, _) = control_tpot_ms(&one);
    let (t2, v) = control_tpot_ms(&two);
    assert!((t2 / t1 - 2.0).abs() < 1e-9, "{t2} against {t1}");
    assert!(
        stdout.contains("config plant.yaml (--step-scale 2)"),
        "{stdout}"
    );
    assert_eq!(v["plant_overrides"]["step_scale"], 2.0, "{v}");
}

#[test]
fn auto_finds_the_factor_the_served_run_decoded_at() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    // The plant's own TPOT for these requests, then a served run 1.5 times as slow.
    let probe = write_recording(dir.path(), "probe.jsonl", 10.0, false);
    let one = dir.path().join("one.json");
    ok(&replay(&probe, &cfg, &one, "1"));
    let (t1, _) = control_tpot_ms(&one);
    let rec = write_recording(dir.path(), "served.jsonl", 1.5 * t1, false);
    // Replayed on the plant's own step, the check says the step is not the served run's.
    let stdout = ok(&replay(&rec, &cfg, &dir.path().join("x1.json"), "1"));
    assert!(
        stdout.contains("warning: the replayed control decodes at")
            && stdout.contains("(-33%)")
            && stdout.contains("--step-scale auto"),
        "{stdout}"
    );
    let json = dir.path().join("auto.json");
    let stdout = ok(&replay(&rec, &cfg, &json, "auto"));
    assert!(
        !stdout.contains("warning: the replayed control"),
        "{stdout}"
    );
    let (t, v) = control_tpot_ms(&json);
    let factor = v["plant_overrides"]["step_scale"]
        .as_f64()
        .expect("the factor found");
    assert!((factor / 1.5 - 1.0).abs() < 1e-3, "{factor}");
    assert!(
        (t / (1.5 * t1) - 1.0).abs() < 1e-3,
        "{t} against {}",
        1.5 * t1
    );
    assert!(stdout.contains("--step-scale auto: x1.50"), "{stdout}");
    assert!(stdout.contains("step x1.50"), "{stdout}");
}

#[test]
fn auto_refuses_a_recording_with_pauses_and_a_run_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let rec = write_recording(dir.path(), "paused.jsonl", 10.0, true);
    let out = replay(&rec, &cfg, &dir.path().join("x.json"), "auto");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds 1 pause (a preemption arm"), "{err}");
    assert!(err.contains("--step-scale F"), "{err}");

    let err = refused(&["--step-scale", "auto"]);
    assert!(
        err.contains("give the run's recording with --replay"),
        "{err}"
    );
}

/// `genslot sim` on the default preset with ARGS, refused: its standard error.
fn refused(args: &[&str]) -> String {
    cli_support::refused(
        genslot()
            .args(["sim", "--quiet", "--preset", "default"])
            .args(["--seeds", "1", "--duration", "10", "--warmup", "0"])
            .args(args),
    )
}

#[test]
fn a_factor_outside_its_range_or_not_a_number_is_refused() {
    for (value, says) in [
        (
            "0",
            "--step-scale must be a finite number in [0.25, 4], got 0",
        ),
        (
            "5",
            "--step-scale must be a finite number in [0.25, 4], got 5",
        ),
        ("fast", "a factor such as 1.05, or auto; got `fast`"),
    ] {
        let err = refused(&["--step-scale", value]);
        assert!(err.contains(says), "{value}: {err}");
    }
}

//! The served H200 experiment's files that can be checked without a GPU: the scripts parse,
//! the arm configs are valid, and the plant they carry is the fit of the measured H200 steps
//! they say it is.

mod cli_support;

use std::process::Command;

use cli_support::{genslot, ok, written};

/// Runs `python3 tools/gpu/SCRIPT FILES… OPTIONS` from the repository root and returns its
/// standard output, or None (with a message) where this machine has no python3.
fn python_script(script: &str, files: &[&str], options: &str) -> Option<String> {
    match Command::new("python3")
        .arg(format!("tools/gpu/{script}"))
        .args(files)
        .args(options.split_whitespace())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    {
        Ok(out) => Some(ok(&out)),
        Err(e) => {
            eprintln!("skipping: no python3 to run {script} ({e})");
            None
        }
    }
}

#[test]
fn the_experiment_scripts_parse() {
    for script in [
        "tools/gpu/h200_experiment.sh",
        "tools/gpu/stage_experiment.sh",
        "tools/gpu/ttft_ab.sh",
    ] {
        let out = Command::new("bash")
            .args(["-n", script])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("bash");
        ok(&out);
    }
    match Command::new("python3")
        .args(["-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())"])
        .arg("tools/gpu/h200_analyze.py")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    {
        Ok(out) => {
            ok(&out);
        }
        Err(e) => eprintln!("skipping: no python3 to parse h200_analyze.py ({e})"),
    }
}

/// A served recording's `arrival_s` counts from the server's start, seconds before the first
/// request; a twin's `sent_s` from its first sends. `arrival_windows.py` must put both on the
/// one clock (the recording's from its first arrival), or a served window is compared with
/// the twin's window some seconds away.
#[test]
fn arrival_windows_counts_a_recording_from_its_first_arrival_as_the_twins_sends() {
    let served = |id: u32, arrival: f64, ttft: f64, outcome: &str| {
        format!(
            "{{\"id\":{id},\"run_start_unix\":1.0,\"arrival_s\":{arrival},\"context_tokens\":10,\
             \"max_tokens\":4,\"output_tokens\":4,\"first_token_s\":{},\"finish_s\":{},\
             \"pauses\":0,\"outcome\":\"{outcome}\"}}\n",
            arrival + ttft,
            arrival + ttft + 1.0
        )
    };
    // First request at 20 s on the server's clock; the next two 80 s and 105 s after it (100
    // and 125 s on the server's clock, windows 90-120 and none). The cancelled one is not
    // counted, as the replay's check counts completed requests only.
    let recording = served(1, 20.0, 1.0, "completed")
        + &served(2, 100.0, 3.0, "completed")
        + &served(3, 125.0, 7.0, "completed")
        + &served(4, 101.0, 50.0, "cancelled");
    let twin = "{\"arm\":\"control\",\"sent_s\":65.0,\"ttft_s\":5.0}\n\
                {\"arm\":\"other\",\"sent_s\":66.0,\"ttft_s\":9.0}\n";
    let (_r, rec) = written("served.jsonl", &recording);
    let (_t, tw) = written("twin.jsonl", twin);
    let served = format!("served={}", rec.display());
    let twin = format!("twin={}@control", tw.display());
    let options = "--to 120 --split 60";
    let Some(out) = python_script("arrival_windows.py", &[&served, &twin], options) else {
        return;
    };
    let row = |window: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(window))
            .unwrap_or_else(|| panic!("no {window} row in {out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    // Served: the request 80 s after the first arrival (3 s) in 60-90, with the twin's 65 s send.
    assert_eq!(
        row("60-90"),
        "60-90 3.00 / 3.00 (1) 5.00 / 5.00 (1)",
        "{out}"
    );
    assert_eq!(
        row("90-120"),
        "90-120 7.00 / 7.00 (1) nan / nan (0)",
        "{out}"
    );
}

/// `occupancy.py` counts a row resident from its admission to its finish, queued from its
/// arrival to its admission, and the residents beyond the slots as paused: the reading of a
/// recording that docs/results.md §7.3's account of a stall rests on.
#[test]
fn occupancy_counts_residents_beyond_the_slots_as_paused_from_the_first_arrival() {
    let row = |id: u32, arrival: f64, admitted: f64, first: f64, finish: f64| {
        format!(
            "{{\"id\":{id},\"arrival_s\":{arrival},\"admitted_s\":{admitted},\
             \"first_token_s\":{first},\"finish_s\":{finish},\"pauses\":0,\
             \"outcome\":\"completed\"}}\n"
        )
    };
    // The clock starts at the first arrival (10 s on the server's clock). Two slots; at 1 s
    // three rows are resident (one paused) and one is queued; at 2 s the first has finished.
    let recording = row(1, 10.0, 10.2, 10.3, 11.8)
        + &row(2, 10.1, 10.3, 10.4, 13.0)
        + &row(3, 10.4, 10.9, 11.3, 13.0)
        + &row(4, 10.8, 11.6, 11.7, 13.0);
    let (_r, rec) = written("served.jsonl", &recording);
    let rec = rec.display().to_string();
    let options = "--from 1 --to 3 --every 1 --slots 2";
    let Some(out) = python_script("occupancy.py", &[&rec], options) else {
        return;
    };
    let rows: Vec<String> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    // t, resident, paused at least, queued, first tokens and completions in [t, t + 1).
    assert_eq!(rows, ["1.00 3 1 1 2 1", "2.00 3 1 0 0 0"], "{out}");
}

/// `batch_mix.py` pools every sampled step's rows for its quantiles, which puts the window's
/// longest row at the top; its typical step takes each quantile's median over the steps, the
/// shape of one step, which is what a bench step on a served mix should run.
#[test]
fn batch_mix_gives_the_typical_steps_quantiles_beside_the_pooled_ones() {
    let row = |id: u32, context: u32, finish: f64| {
        format!(
            "{{\"id\":{id},\"arrival_s\":0.0,\"first_token_s\":0.0,\"finish_s\":{finish},\
             \"context_tokens\":{context},\"output_tokens\":0}}\n"
        )
    };
    // At 0 s four rows of 1, 1, 1 and 5 tokens (ratios 0.5, 0.5, 0.5, 2.5 to their mean); at
    // 1 s the long one has finished and three rows of 1 token remain (ratios 1).
    let recording = row(1, 1, 10.0) + &row(2, 1, 10.0) + &row(3, 1, 10.0) + &row(4, 5, 0.5);
    let (_r, rec) = written("served.jsonl", &recording);
    let rec = rec.display().to_string();
    let options = "--from 0 --to 2 --every 1 --points 3";
    let Some(out) = python_script("batch_mix.py", &[&rec], options) else {
        return;
    };
    let after = |header: &str| {
        let mut lines = out.lines().skip_while(|l| !l.starts_with(header));
        lines.nth(1).unwrap_or_default().to_string()
    };
    // Pooled: 0.5, 0.5, 0.5, 1, 1, 1, 2.5 at 0, 1/2 and 1.
    assert_eq!(after("context / step mean"), "0.50,1.00,2.50", "{out}");
    // Each step's 0, 1/2 and 1 quantiles (0.5, 0.5, 2.5 and 1, 1, 1), their medians.
    assert_eq!(after("the typical step"), "0.75,0.75,1.75", "{out}");
    assert!(out.contains("longest row / mean: median 1.75"), "{out}");
}

#[test]
fn the_arm_configs_are_valid_and_differ_only_in_preemption() {
    let control = ok(&genslot()
        .args(["check-config", "tools/gpu/h200-llama-8b-control.yaml"])
        .output()
        .unwrap());
    let tpot = ok(&genslot()
        .args(["check-config", "tools/gpu/h200-llama-8b-tpot.yaml"])
        .output()
        .unwrap());
    assert!(tpot.contains("tpot_budget: 0.1"), "{tpot}");
    let strip = |s: &str| {
        s.lines()
            .filter(|l| {
                !["gen_preemption", "tpot_budget", "initial_gain", "gain_from"]
                    .iter()
                    .any(|k| l.contains(k))
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&control), strip(&tpot));
}

/// The configs' `timing:` is the fit of the served experiment's own step grid and transfer
/// probe (the `h200-llama-8b` preset's), not a plant fitted to other steps. That fit kept the
/// grid's four steps on aliased pages (`--keep-aliased`); without them the per-token cost is
/// 1.3 % higher (docs/results.md §7).
#[test]
fn the_configs_timing_is_the_fit_of_the_experiments_grid_and_probe() {
    let dir = tempfile::tempdir().unwrap();
    let timing = dir.path().join("timing.yaml");
    ok(&genslot()
        .args([
            "fit-step",
            "docs/h200/experiment-2/grid-llama-8b.json",
            "--keep-aliased",
        ])
        .args([
            "--transfer-record",
            "docs/h200/experiment-2/probe.jsonl",
            "--timing",
        ])
        .arg(&timing)
        .output()
        .unwrap());
    let fitted = std::fs::read_to_string(&timing).unwrap();
    // The number after `key: ` on a line of a YAML text (NaN when there is none).
    let value = |text: &str, key: &str| -> f64 {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    for file in ["h200-llama-8b-control.yaml", "h200-llama-8b-tpot.yaml"] {
        let config = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tools/gpu")
                .join(file),
        )
        .expect("the arm's config");
        for key in [
            "base_ms",
            "per_request_ms",
            "per_kv_token_ns",
            "transfer_base_ms",
            "transfer_per_token_us",
        ] {
            let (f, c) = (value(&fitted, key), value(&config, key));
            assert!(
                (f - c).abs() <= 1e-3 * f.abs(),
                "{file} {key}: fit {f}, config {c}"
            );
        }
    }
}

//! `genslot sim`'s command line: a value outside its flag's rule is refused naming the flag
//! and the rule, before anything runs.

mod cli_support;

use cli_support::{genslot, sim_json, written};

/// `genslot sim ARGS` refused: its standard error.
fn refused(args: &[&str]) -> String {
    cli_support::refused(
        genslot()
            .args(["sim", "--quiet", "--seeds", "1"])
            .args(args),
    )
}

#[test]
fn a_number_outside_its_flags_rule_is_refused_naming_the_flag_and_the_rule() {
    for (args, says) in [
        (
            &["--duration", "-10"][..],
            "--duration must be a number of seconds in (0, 1000000], got -10",
        ),
        (
            &["--duration", "inf"],
            "--duration must be a number of seconds in (0, 1000000], got inf",
        ),
        (
            &["--duration", "1e300"],
            "--duration must be a number of seconds in (0, 1000000], got 1e300",
        ),
        (
            &["--duration", "NaN"],
            "--duration must be a number of seconds",
        ),
        (
            &["--warmup", "-1"],
            "--warmup must be a finite number in [0, 1000000], got -1",
        ),
        (
            &["--warmup", "400", "--duration", "300"],
            "--duration (300) must exceed --warmup (400)",
        ),
        (
            &["--concurrency", "0"],
            "--concurrency must be at least 1, got 0",
        ),
        (
            &["--concurrency", "2000000"],
            "--concurrency must be at most 100000, got 2000000",
        ),
        (&["--sweep", "130,0"], "--sweep must be at least 1, got 0"),
        (
            &["--synthetic-sessions", "4294967295"],
            "--synthetic-sessions must be at most 100000, got 4294967295",
        ),
        (
            &["--bench", "1000000000"],
            "--bench must be at most 1000, got 1000000000",
        ),
        (&["--bench", "0"], "--bench must be at least 1, got 0"),
        (
            &["--rate-scale", "0"],
            "--rate-scale must be a finite number above 0, got 0",
        ),
        (
            &["--rate-scale", "-2"],
            "--rate-scale must be a finite number above 0, got -2",
        ),
        (
            &["--fixed-target", "1e300"],
            "--fixed-target must be a number of seconds in (0, 1000000], got 1e300",
        ),
        (
            &["--target-window", "0"],
            "--target-window must be at least 1, got 0",
        ),
        (
            &["--target-window", "2000000"],
            "--target-window must be at most 1048576",
        ),
        (
            &["--jump-ms", "-1"],
            "--jump-ms must be a finite number in [0, 1000000], got -1",
        ),
        (
            &["--per-request-above-ms", "inf"],
            "--per-request-above-ms must be a finite number in [0, 1000000], got inf",
        ),
        (
            &["--output-scale", "-1"],
            "--output-scale must be a finite number in (0, 100], got -1",
        ),
        (
            &["--output-scale", "1e12"],
            "--output-scale must be a finite number in (0, 100], got 1000000000000",
        ),
        (&["--idle-cap", "-1"], "--idle-cap must be >= 0"),
        (
            &["--send-jitter", "-5"],
            "--send-jitter must be a finite number in [0, 1000000], got -5",
        ),
        (
            &["--send-jitter", "NaN"],
            "--send-jitter must be a finite number in [0, 1000000], got NaN",
        ),
        (&["--context-scale", "2"], "--context-scale: "),
        (&["--max-context", "0"], "--max-context: "),
    ] {
        let err = refused(args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_negative_count_is_read_as_the_flags_value_not_as_a_flag() {
    let err = refused(&["--concurrency", "-5"]);
    assert!(err.contains("'-5' for '--concurrency"), "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");
}

#[test]
fn an_arm_that_breaks_the_configs_rule_is_refused_naming_the_arm_and_the_rule() {
    for (arm, says) in [
        (
            "control,max_batch_size=0",
            "bad arm `max_batch_size=0`: max_batch_size must be at least 1, got 0",
        ),
        (
            "control,max_num_active_requests=0",
            "bad arm `max_num_active_requests=0`: max_num_active_requests must be at least 1, got 0",
        ),
        (
            "control,max_batch_size=100000",
            "bad arm `max_batch_size=100000`: max_batch_size must be at most 65536, got 100000",
        ),
        (
            "control,target_output_tps=inf",
            "bad arm `target_output_tps=inf`: target_output_tps must be a finite rate above 0",
        ),
    ] {
        let err = refused(&["--arms", arm]);
        assert!(err.contains(says), "{arm}: {err}");
    }
}

const MOONCAKE: &str = "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5}\n\
                        {\"timestamp\": 1200, \"input_length\": 80, \"output_length\": 7}\n";
const AZURE: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                     2023-11-16 18:15:46.68,374,44\n\
                     2023-11-16 18:15:50.99,396,109\n";

#[test]
fn lane_flags_on_an_open_loop_trace_are_refused_pointing_at_the_rate_scale() {
    let (_m, mooncake) = written("mc.jsonl", MOONCAKE);
    let (_a, azure) = written("az.csv", AZURE);
    for (trace, what) in [(&mooncake, "a Mooncake trace"), (&azure, "an Azure trace")] {
        let trace = trace.to_str().unwrap();
        for (flag, value) in [
            ("--concurrency", "10"),
            ("--sweep", "1,2"),
            ("--idle-cap", "3"),
            ("--send-jitter", "40"),
        ] {
            let err = refused(&["--trace", trace, flag, value]);
            assert!(
                err.contains(&format!("{flag} applies to closed-loop lanes")),
                "{flag}: {err}"
            );
            assert!(
                err.contains(&format!("{what} is replayed open loop by its timestamps")),
                "{err}"
            );
            assert!(err.contains("--rate-scale"), "{err}");
        }
    }
}

#[test]
fn a_rate_scale_on_closed_loop_sessions_is_refused() {
    let err = refused(&["--rate-scale", "2"]);
    assert!(
        err.contains("--rate-scale scales the timestamps of Mooncake and Azure"),
        "{err}"
    );
}

#[test]
fn a_sweep_and_a_concurrency_together_are_refused_not_one_dropped() {
    let err = refused(&["--sweep", "100,120", "--concurrency", "300"]);
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn synthetic_sessions_with_a_trace_are_refused_not_ignored() {
    let (_m, mooncake) = written("mc.jsonl", MOONCAKE);
    let err = refused(&[
        "--trace",
        mooncake.to_str().unwrap(),
        "--synthetic-sessions",
        "5",
    ]);
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn an_arm_list_naming_no_arm_is_refused() {
    for arms in ["", " , "] {
        let err = refused(&["--arms", arms]);
        assert!(err.contains("--arms names no arm"), "{arms:?}: {err}");
    }
}

#[test]
fn lane_flags_on_a_replay_are_refused() {
    let (_r, recording) = written(
        "served.jsonl",
        "{\"id\":1,\"run_start_unix\":5.0,\"arrival_s\":1.0,\"context_tokens\":10,\
         \"max_tokens\":4,\"output_tokens\":4,\"first_token_s\":1.5,\"finish_s\":2.0,\
         \"pauses\":0,\"outcome\":\"completed\"}\n",
    );
    for (flag, value) in [
        ("--concurrency", "4"),
        ("--idle-cap", "3"),
        ("--send-jitter", "40"),
    ] {
        let err = refused(&["--replay", recording.to_str().unwrap(), flag, value]);
        assert!(
            err.contains(&format!(
                "{flag} applies to closed-loop lanes; a replay keeps"
            )),
            "{err}"
        );
    }
}

/// `genslot sim ARGS --json` run to its end: its standard output and the JSON.
fn ran(args: &[&str]) -> (String, serde_json::Value) {
    ran_seeds("1", args)
}

/// `ran` with this many seeds.
fn ran_seeds(seeds: &str, args: &[&str]) -> (String, serde_json::Value) {
    sim_json(&[&["--seeds", seeds], args].concat())
}

/// Output tokens of the one arm over a 100 s run.
fn output_tokens(v: &serde_json::Value) -> f64 {
    (v["arms"][0]["output_tps"].as_f64().unwrap() * 100.0).round()
}

#[test]
fn the_reference_output_scale_applies_to_an_azure_trace_only_when_asked_and_is_stated() {
    let (_a, azure) = written(
        "one.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:58.2,1523,250\n",
    );
    let run = ["--preset", "reference", "--trace", azure.to_str().unwrap()];
    let shape = ["--duration", "100", "--warmup", "0", "--arms", "control"];
    let (text, v) = ran(&[&run[..], &shape[..]].concat());
    assert_eq!(output_tokens(&v), 250.0, "{v}");
    assert!(
        v.get("output_scale").is_none(),
        "a scale of 1 is not written: {v}"
    );
    assert!(
        text.contains("output scale 1: the preset's 2.6 is fitted to the Weka traces' outputs"),
        "{text}"
    );
    assert!(
        text.contains("== open loop, Azure trace one.csv, preset reference, 1 seed x 100 s"),
        "{text}"
    );
    assert_eq!(v["workload"]["kind"], "trace", "{v}");
    assert_eq!(v["workload"]["format"], "azure", "{v}");
    assert_eq!(v["workload"]["open_loop"], true, "{v}");
    assert!(v.get("plant_overrides").is_none(), "{v}");
    let (text, v) = ran(&[&run[..], &shape[..], &["--output-scale", "2.6"][..]].concat());
    assert_eq!(output_tokens(&v), 650.0, "{v}");
    assert_eq!(v["output_scale"], 2.6, "{v}");
    assert!(
        text.contains(
            "== open loop, Azure trace one.csv, preset reference, output scale 2.6, 1 seed x"
        ),
        "{text}"
    );
    assert_eq!(v["plant_overrides"]["output_scale"], 2.6, "{v}");
}

#[test]
fn the_header_states_the_output_scale_of_the_weka_fitted_preset_on_synthetic_sessions() {
    let header = |preset: &[&str]| ran(&[preset, &SMALL[..], &["--arms", "control"]].concat()).0;
    let text = header(&[]);
    assert!(
        text.contains(
            "== c4, synthetic workload (20 sessions), preset reference, output scale 2.6, 1 seed x"
        ),
        "{text}"
    );
    let text = header(&["--preset", "h200-llama-8b"]);
    assert!(
        text.contains("== c4, synthetic workload (20 sessions), preset h200-llama-8b, 1 seed x"),
        "{text}"
    );
}

#[test]
fn a_trace_that_cannot_be_read_is_named_with_the_flag_and_its_cause_once() {
    let err = refused(&["--trace", "no-such-trace.jsonl"]);
    assert!(err.contains("--trace: no-such-trace.jsonl: "), "{err}");
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
    assert_eq!(err.matches("no-such-trace.jsonl").count(), 1, "{err}");
    let err = refused(&["--replay", "no-such-recording.jsonl"]);
    assert!(err.contains("--replay: no-such-recording.jsonl: "), "{err}");
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
}

#[test]
fn an_empty_trace_has_no_requests_and_an_unknown_one_names_its_line_and_the_format_flag() {
    let (_e, empty) = written("empty.jsonl", "\n  \n");
    let err = refused(&["--trace", empty.to_str().unwrap()]);
    assert!(
        err.contains("empty.jsonl: no requests in the trace"),
        "{err}"
    );
    let (_u, odd) = written("odd.csv", "hello,world\n");
    let err = refused(&["--trace", odd.to_str().unwrap()]);
    assert!(
        err.contains("odd.csv:1: cannot tell the trace format from `hello,world`"),
        "{err}"
    );
    assert!(err.contains("--trace-format names it"), "{err}");
}

#[test]
fn a_named_trace_format_is_read_by_that_formats_reader() {
    let (_m, mooncake) = written("mc.jsonl", MOONCAKE);
    let err = refused(&[
        "--trace",
        mooncake.to_str().unwrap(),
        "--trace-format",
        "azure",
    ]);
    assert!(
        err.contains("mc.jsonl:1: header lacks column `timestamp`"),
        "{err}"
    );
    let (_a, azure) = written("requests.txt", AZURE);
    let (text, v) = ran(&[
        "--trace",
        azure.to_str().unwrap(),
        "--trace-format",
        "azure",
        "--duration",
        "100",
        "--warmup",
        "0",
        "--arms",
        "control",
    ]);
    assert!(text.contains("== open loop"), "{text}");
    assert_eq!(v["arms"][0]["requests"], 2, "{v}");
    let err = refused(&["--trace-format", "mooncake"]);
    assert!(err.contains("--trace <TRACE>"), "{err}");
}

#[test]
fn an_arm_that_completes_no_measured_request_shows_no_latency_rather_than_nan() {
    // Outputs 100 times the synthetic ones: nothing finishes within 20 s.
    let (text, _) = ran(&[
        "--synthetic-sessions",
        "20",
        "--concurrency",
        "4",
        "--duration",
        "20",
        "--warmup",
        "0",
        "--output-scale",
        "100",
        "--arms",
        "control,max_batch_size=1",
    ]);
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("max_batch_size=1 ") && !l.contains('['))
        .unwrap_or_else(|| panic!("no arm row in {text}"));
    assert!(row.split_whitespace().nth(1) == Some("-"), "{row}");
    assert!(text.contains("- (no completions)"), "{text}");
}

#[test]
fn bench_times_the_experiment_the_asked_number_of_times_and_writes_no_tables() {
    let out = genslot()
        .args(["sim", "--seeds", "1", "--synthetic-sessions", "20"])
        .args(["--concurrency", "4", "--duration", "30", "--warmup", "0"])
        .args(["--arms", "control", "--bench", "2"])
        .output()
        .expect("run genslot sim");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("run ")).count(),
        2,
        "{text}"
    );
    assert!(text.contains("2 runs: median"), "{text}");
    assert!(text.contains("peak resident memory:"), "{text}");
    assert!(!text.contains("ttft50"), "{text}");
    let err = refused(&["--bench", "2", "--json", "x.json"]);
    assert!(err.contains("--json"), "{err}");
    let err = refused(&["--bench", "0"]);
    assert!(err.contains("--bench must be at least 1"), "{err}");
}

#[test]
fn seeds_are_a_count_from_one_to_the_configs_bound() {
    for (seeds, says) in [
        ("0", "--seeds must be at least 1, got 0"),
        ("99999999", "--seeds must be at most 1048576, got 99999999"),
    ] {
        let out = genslot()
            .args(["sim", "--quiet", "--seeds", seeds])
            .output()
            .expect("run genslot sim");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
    }
}

/// A config with `tpot_budget: 0.1` and `extra` in its `gen_preemption`, for a run saturated
/// enough that g's start and rule change its numbers.
fn preemption_config(name: &str, extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    written(
        name,
        &format!(
            "max_batch_size: 8\nscheduler_config:\n  gen_admission: {{ min_samples: 20, target_window: 100 }}\n  gen_preemption: {{ tpot_budget: 0.1{extra} }}\n"
        ),
    )
}

/// `arms` on `config` over 60 sessions in 32 lanes: the header and the JSON.
fn saturated(config: &std::path::Path, arms: &str) -> (String, serde_json::Value) {
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--arms",
        arms,
        "--synthetic-sessions",
        "60",
        "--concurrency",
        "32",
        "--duration",
        "600",
        "--warmup",
        "60",
    ];
    ran(&args)
}

/// An arm's numbers by its name, the name left out.
fn arm_numbers(v: &serde_json::Value, name: &str) -> serde_json::Value {
    let mut a = v["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no arm {name} in {v}"))
        .clone();
    a.as_object_mut().unwrap().remove("name");
    a
}

#[test]
fn a_configs_initial_gain_starts_every_tpot_budget_arm_that_names_no_g0() {
    let (_a, with) = preemption_config("with.yaml", ", initial_gain: 0.25");
    let (_b, without) = preemption_config("without.yaml", "");
    let (text, from_config) = saturated(&with, "control,tpot_budget=0.10");
    assert!(text.contains(", g starts at 0.25 (config)"), "{text}");
    let (text, explicit) = saturated(&without, "tpot_budget=0.10+g0=0.25,tpot_budget=0.10");
    assert!(
        text.contains(", g starts at 1 (config)"),
        "the default, resolved: {text}"
    );
    let started_low = arm_numbers(&from_config, "tpot_budget=0.10");
    assert_eq!(
        started_low,
        arm_numbers(&explicit, "tpot_budget=0.10+g0=0.25")
    );
    assert_ne!(
        started_low,
        arm_numbers(&explicit, "tpot_budget=0.10"),
        "g's start changes this saturated run"
    );
    // `g0=` in the arm still wins over the config's start.
    let (_, overridden) = saturated(&with, "tpot_budget=0.10+g0=1");
    assert_eq!(
        arm_numbers(&overridden, "tpot_budget=0.10+g0=1"),
        arm_numbers(&explicit, "tpot_budget=0.10")
    );
}

/// `pauses=N` reaches the controller: the SPEC's 2 written out is the plain arm, and a limit
/// of 1 or 6 changes this saturated run, where some requests are paused twice (an arm that
/// did not reach the controller would leave every number as the plain arm's).
#[test]
fn a_pauses_arm_moves_tpot_budgets_per_request_limit_and_pauses_2_is_the_spec() {
    let (_a, plain) = preemption_config("plain.yaml", "");
    let (_, v) = saturated(
        &plain,
        "tpot_budget=0.10,tpot_budget=0.10+pauses=2,tpot_budget=0.10+pauses=1,tpot_budget=0.10+pauses=6",
    );
    let spec = arm_numbers(&v, "tpot_budget=0.10");
    assert!(spec["pauses"].as_u64().unwrap() > 0, "the run pauses: {v}");
    assert_eq!(spec, arm_numbers(&v, "tpot_budget=0.10+pauses=2"));
    for moved in ["tpot_budget=0.10+pauses=1", "tpot_budget=0.10+pauses=6"] {
        assert_ne!(spec, arm_numbers(&v, moved), "{moved}");
    }
}

#[test]
fn a_configs_gain_from_holds_every_tpot_budget_arm_that_names_no_g_from() {
    let (_a, held) = preemption_config("held.yaml", ", gain_from: paused");
    let (_b, plain) = preemption_config("plain.yaml", "");
    let (text, from_config) = saturated(&held, "control,tpot_budget=0.10");
    assert!(
        text.contains(", g starts at 1 (config), held until a paused request completes"),
        "{text}"
    );
    let (_, explicit) = saturated(&plain, "tpot_budget=0.10+g_from=paused,tpot_budget=0.10");
    let holding = arm_numbers(&from_config, "tpot_budget=0.10");
    assert_eq!(
        holding,
        arm_numbers(&explicit, "tpot_budget=0.10+g_from=paused")
    );
    assert_ne!(
        holding,
        arm_numbers(&explicit, "tpot_budget=0.10"),
        "holding g changes this saturated run"
    );
    // `g_from=` in the arm still wins over the config's.
    let (_, overridden) = saturated(&held, "tpot_budget=0.10+g_from=any");
    assert_eq!(
        arm_numbers(&overridden, "tpot_budget=0.10+g_from=any"),
        arm_numbers(&explicit, "tpot_budget=0.10")
    );
}

/// A small synthetic run: 20 sessions in 4 lanes for 30 s, all measured.
const SMALL: [&str; 8] = [
    "--synthetic-sessions",
    "20",
    "--concurrency",
    "4",
    "--duration",
    "30",
    "--warmup",
    "0",
];

#[test]
fn a_huge_override_is_stated_in_exponent_form_not_hundreds_of_digits() {
    let (text, _) = ran(&[
        &SMALL[..],
        &["--idle-cap", "1e300", "--arms", "control"][..],
    ]
    .concat());
    assert!(text.contains("(--idle-cap 1e300)"), "{text}");
}

#[test]
fn the_header_and_the_json_state_the_plant_overrides_the_config_and_the_workload() {
    let overrides = [
        "--idle-cap",
        "5",
        "--send-jitter",
        "40",
        "--jump-ms",
        "5",
        "--per-request-above-ms",
        "0.5",
        "--arms",
        "control",
    ];
    let (text, v) = ran(&[&SMALL[..], &overrides[..]].concat());
    assert!(
        text.contains(
            "== c4, synthetic workload (20 sessions), preset reference (--idle-cap 5, \
             --send-jitter 40, --jump-ms 5, --per-request-above-ms 0.5), output scale 2.6, \
             1 seed x 30 s"
        ),
        "{text}"
    );
    assert_eq!(
        v["plant_overrides"],
        serde_json::json!({
            "idle_cap_s": 5.0,
            "send_jitter_ms": 40.0,
            "jump_ms": 5.0,
            "per_request_above_ms": 0.5
        }),
        "{v}"
    );
    // The plant that ran, overrides applied; the fields the docs read stay.
    assert_eq!(v["plant"]["idle_cap_s"], 5.0, "{v}");
    assert_eq!(v["plant"]["send_jitter_s"], 0.04, "{v}");
    assert_eq!(v["plant"]["step"]["jump_ms"], 5.0, "{v}");
    assert_eq!(v["plant"]["step"]["per_request_above_ms"], 0.5, "{v}");
    assert_eq!(v["preset"], "reference", "{v}");
    assert_eq!(v["output_scale"], 2.6, "{v}");
    assert_eq!(
        v["workload"],
        serde_json::json!({ "kind": "synthetic", "sessions": 20, "open_loop": false }),
        "{v}"
    );
    assert!(v.get("config").is_none(), "{v}");

    let (_c, config) = written("small.yaml", "max_batch_size: 8\n");
    let (text, v) = ran(&[
        &SMALL[..],
        &["--config", config.to_str().unwrap(), "--arms", "control"][..],
    ]
    .concat());
    assert!(
        text.contains("== c4, synthetic workload (20 sessions), config small.yaml, 1 seed x"),
        "{text}"
    );
    assert!(!text.contains("preset config"), "{text}");
    assert_eq!(v["preset"], "config", "{v}");
    assert_eq!(v["config"], config.to_str().unwrap(), "{v}");
    assert_eq!(v["plant"]["max_batch_size"], 8, "{v}");
    assert!(v.get("plant_overrides").is_none(), "{v}");
}

#[test]
fn one_seed_and_one_run_are_singular_and_a_lone_control_has_no_paired_section() {
    let (text, _) = ran(&[&SMALL[..], &["--arms", "control"][..]].concat());
    assert!(text.contains(", 1 seed x 30 s"), "{text}");
    assert!(text.contains(", 1 run in "), "{text}");
    assert!(
        !text.contains("1 seeds") && !text.contains("1 runs"),
        "{text}"
    );
    assert!(!text.contains("arm vs control"), "{text}");
    let (text, _) = ran(&[&SMALL[..], &["--arms", "control,max_batch_size=2"][..]].concat());
    assert!(text.contains(", 2 runs in "), "{text}");
    assert!(text.contains("arm vs control (per seed)"), "{text}");
}

#[test]
fn an_open_loop_trace_that_ends_within_the_warmup_is_warned_of_naming_the_flags() {
    let (_m, mooncake) = written("mc.jsonl", MOONCAKE);
    let trace = ["--trace", mooncake.to_str().unwrap(), "--arms", "control"];
    // Arrivals at 0 and 1.2 s, at twice the rate: the last at 0.6 s, in the 300 s warm-up.
    let (text, v) = ran(&[&trace[..], &["--rate-scale", "2", "--duration", "400"][..]].concat());
    let says = "nothing is measured: the trace's last arrival at --rate-scale 2 is at 0.6 s, \
                before the 300 s warm-up ends; lower --warmup below it (--warmup 0 \
                --duration 1 measures the whole trace), or lower --rate-scale";
    assert!(text.contains(&format!("warning: {says}")), "{text}");
    assert_eq!(v["warnings"], serde_json::json!([says]), "{v}");
    assert!(
        text.contains("Mooncake trace mc.jsonl at 2x rate"),
        "{text}"
    );
    assert_eq!(v["workload"]["rate_scale"], 2.0, "{v}");
    // Measured from the start to just past the last arrival: no warning.
    let (text, v) = ran(&[&trace[..], &["--warmup", "0", "--duration", "1.3"][..]].concat());
    assert!(!text.contains("warning"), "{text}");
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    // On to 400 s: the throughputs are over a window almost all after the last arrival.
    let (text, _) = ran(&[&trace[..], &["--warmup", "0", "--duration", "400"][..]].concat());
    assert!(
        text.contains("warning: the trace's last arrival is at 1.2 s of the 400 s run"),
        "{text}"
    );
}

#[test]
fn a_measured_window_without_arrivals_is_warned_of_naming_the_flags() {
    // Arrivals at 0 and 1200 s: none in [10, 20).
    let (_m, sparse) = written(
        "sparse.jsonl",
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5}\n\
         {\"timestamp\": 1200000, \"input_length\": 80, \"output_length\": 7}\n",
    );
    let (text, v) = ran(&[
        "--trace",
        sparse.to_str().unwrap(),
        "--warmup",
        "10",
        "--duration",
        "20",
        "--arms",
        "control",
    ]);
    let says = "nothing is measured: no request arrived in the measured window [10, 20) s; \
                move it with --warmup and --duration";
    assert!(text.contains(&format!("warning: {says}")), "{text}");
    assert_eq!(v["warnings"], serde_json::json!([says]), "{v}");
}

#[test]
fn open_loop_runs_one_seed_unless_asked_and_more_are_stated_to_be_identical() {
    let (_m, mooncake) = written("mc.jsonl", MOONCAKE);
    let run = [
        "--trace",
        mooncake.to_str().unwrap(),
        "--warmup",
        "0",
        "--duration",
        "100",
        "--arms",
        "control,tpot_budget=0.10",
    ];
    let note = "open loop: every seed replays the same arrivals, so the seeds are identical runs";
    let (text, v) = ran_seeds("3", &run);
    assert!(
        text.contains(&format!("3 seeds x 100 s (first 0 s unmeasured; {note})")),
        "{text}"
    );
    assert_eq!(text.matches(note).count(), 1, "{text}");
    assert_eq!(v["workload"]["open_loop"], true, "{v}");
    let (text, _) = ran_seeds("1", &run);
    assert!(!text.contains(note), "{text}");
    // Without --seeds, one run.
    let out = genslot()
        .args(["sim", "--quiet"])
        .args(run)
        .output()
        .expect("run genslot sim");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 seed x 100 s"), "{text}");
    // Closed-loop lanes start each seed elsewhere in the sessions: no note.
    let (text, _) = ran_seeds("2", &[&SMALL[..], &["--arms", "control"][..]].concat());
    assert!(!text.contains("identical"), "{text}");
}

#[test]
fn the_help_describes_the_output_files_every_arm_key_and_the_timelines_g() {
    let out = genslot()
        .args(["sim", "--help"])
        .output()
        .expect("run genslot sim --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    // The line after a flag's own is its description.
    let described = |flag: &str| {
        let mut lines = help
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(flag));
        lines
            .next()
            .unwrap_or_else(|| panic!("no {flag} in {help}"));
        lines.next().map(str::trim).unwrap_or_default().to_string()
    };
    for flag in ["--json <FILE>", "--svg <FILE>", "--timeline <FILE>"] {
        let text = described(flag);
        assert!(
            !text.is_empty() && !text.starts_with("--"),
            "{flag} has no help: {help}"
        );
    }
    assert!(described("--svg").contains("X-c130.svg"), "{help}");
    assert!(described("--timeline").contains(", g,"), "{help}");
    assert!(
        described("--arms").contains("max_num_active_requests=N"),
        "{help}"
    );
}

#[test]
fn an_unknown_arm_key_is_refused_listing_the_valid_keys() {
    let err = refused(&["--arms", "tpot=0.1"]);
    assert!(
        err.contains(
            "unknown key `tpot` (one of tpot_budget, target_output_tps, max_batch_size, \
             max_num_active_requests, order, victim, g0, g_from, pauses; or control alone)"
        ),
        "{err}"
    );
}

/// `genslot sim … --json F | head`: the reader goes away before the tables are printed; the
/// run still succeeds and writes its JSON.
#[test]
fn a_closed_stdout_does_not_stop_the_run_or_its_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let mut child = genslot()
        .args([
            "sim",
            "--quiet",
            "--seeds",
            "1",
            "--synthetic-sessions",
            "20",
        ])
        .args(["--concurrency", "4", "--duration", "60", "--warmup", "10"])
        .arg("--json")
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run genslot sim");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(v["arms"].is_array(), "{v}");
}

#[test]
fn a_preset_and_a_config_together_are_refused_not_one_silently_ignored() {
    let err = refused(&[
        "--preset",
        "h200-llama-8b",
        "--config",
        "config/default.yaml",
    ]);
    assert!(err.contains("cannot be used with"), "{err}");
}

/// The default arms include `target_output_tps=auto`, which needs the control's output rate:
/// when the window measured nothing, the error says so and names the flags that move it.
#[test]
fn an_auto_target_over_an_empty_window_says_nothing_was_measured_and_how_to_move_it() {
    let err = refused(&["--concurrency", "8", "--warmup", "10", "--duration", "11"]);
    assert!(err.contains("target_output_tps=auto"), "{err}");
    assert!(err.contains("nothing is measured"), "{err}");
    assert!(err.contains("--warmup and --duration"), "{err}");
}

/// An output that cannot be written is refused before the run, not after it.
#[test]
fn output_files_that_cannot_be_written_are_refused_before_the_run() {
    let dir = std::env::temp_dir().join(format!("sim-cli-outputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let err = refused(&["--json", d]);
    assert!(
        err.contains("--json") && err.contains("is a folder"),
        "{err}"
    );
    let missing = format!("{d}/no/such/folder/out.svg");
    let err = refused(&["--svg", &missing]);
    assert!(
        err.contains("--svg") && err.contains("does not exist"),
        "{err}"
    );
    let same = format!("{d}/out.json");
    let err = refused(&["--json", &same, "--timeline", &same]);
    assert!(
        err.contains("--json and --timeline name the same file"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_with_no_request_is_refused_naming_the_file() {
    let (_d, trace) = written("empty.jsonl", "{\"id\":\"s1\",\"requests\":[]}\n");
    let err = refused(&["--trace", trace.to_str().unwrap()]);
    assert!(
        err.contains("empty.jsonl") && err.contains("no session in it has a request"),
        "{err}"
    );
}

#[test]
fn a_first_seed_heads_the_report_with_the_seeds_that_ran() {
    for (extra, says) in [
        (&["--first-seed", "3", "--seeds", "1"][..], "seed 3 x 60 s"),
        (&["--first-seed", "3", "--seeds", "2"], "seeds 3-4 x 60 s"),
        (&["--seeds", "2"], "2 seeds x 60 s"),
    ] {
        let out = genslot()
            .args(["sim", "--quiet", "--preset", "default", "--arms", "control"])
            .args(["--concurrency", "8", "--duration", "60", "--warmup", "0"])
            .args(extra)
            .output()
            .expect("run genslot sim");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{extra:?}: {stdout}");
        assert!(stdout.contains(says), "{extra:?}: {stdout}");
    }
}

#[test]
fn records_holds_one_line_per_measured_request_sent_in_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let lines = dir.path().join("r.jsonl");
    let (_, v) = ran_seeds(
        "2",
        &[
            "--synthetic-sessions",
            "200",
            "--concurrency",
            "60",
            "--warmup",
            "30",
            "--duration",
            "120",
            "--arms",
            "control,tpot_budget=0.10",
            "--records",
            lines.to_str().unwrap(),
        ],
    );
    let text = std::fs::read_to_string(&lines).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for arm in v["arms"].as_array().unwrap() {
        let name = arm["name"].as_str().unwrap();
        let mine: Vec<_> = rows.iter().filter(|r| r["arm"] == name).collect();
        assert_eq!(
            mine.len() as u64,
            arm["requests"].as_u64().unwrap(),
            "{name}"
        );
        let seeds: std::collections::BTreeSet<u64> =
            mine.iter().map(|r| r["seed"].as_u64().unwrap()).collect();
        assert_eq!(seeds.into_iter().collect::<Vec<_>>(), [0, 1]);
        for r in mine {
            let sent = r["sent_s"].as_f64().unwrap();
            assert!((30.0..120.0).contains(&sent), "{r}");
            let (ttft, e2e) = (r["ttft_s"].as_f64().unwrap(), r["e2e_s"].as_f64().unwrap());
            assert!(0.0 < ttft && ttft <= e2e, "{r}");
            assert!(r["output_tokens"].as_u64().unwrap() >= 1, "{r}");
        }
    }
}

//! The YAML configuration as a user meets it: defaults, bounds, exclusivity, positions in
//! errors, the shipped files and `check-config`.

use genslot::config::{
    check_config, AdmissionPolicy, Backend, Config, ConfigError, GainFrom, ModelSource, Position,
    Preemption,
};
use std::path::{Path, PathBuf};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn load(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_str(yaml, "test.yaml")
}

fn accepted(yaml: &str) -> Config {
    match load(yaml) {
        Ok(cfg) => cfg,
        Err(e) => panic!("expected\n{yaml}\nto be accepted, got: {e}"),
    }
}

/// Asserts `yaml` is rejected with an error on `field`, written at `line`.
fn rejected_at(yaml: &str, field: &str, line: u32) -> ConfigError {
    let err = match load(yaml) {
        Ok(_) => panic!("expected\n{yaml}\nto be rejected on {field}"),
        Err(e) => e,
    };
    // Values the YAML layer already refuses (e.g. `.nan`) come back as parse errors.
    let at = match &err {
        ConfigError::Parse { field: f, at, .. } if f.as_deref() == Some(field) => *at,
        _ => {
            err.issues()
                .iter()
                .find(|i| i.field == field)
                .unwrap_or_else(|| panic!("no issue on {field} in: {err}"))
                .at
        }
    };
    assert_eq!(at.map(|p| p.line), Some(line), "{err}");
    let text = err.to_string();
    assert!(text.contains(field), "{text}");
    assert!(text.contains(&format!("test.yaml:{line}:")), "{text}");
    err
}

fn preempt(field: &str, value: &str) -> String {
    format!("scheduler_config:\n  gen_preemption:\n    {field}: {value}\n")
}

fn admission(lines: &str) -> String {
    format!("scheduler_config:\n  gen_admission:\n{lines}")
}

#[test]
fn embedded_default_file_matches_the_built_in_defaults() {
    let embedded = Config::embedded_default().expect("embedded default loads");
    assert_eq!(embedded, Config::default().resolved());
}

#[test]
fn an_empty_or_comment_only_file_takes_every_default() {
    let expected = Config::default().resolved();
    assert_eq!(accepted(""), expected);
    assert_eq!(accepted("# nothing here\n\n"), expected);
    assert_eq!(accepted("{}"), expected);
}

#[test]
fn a_section_left_empty_or_null_takes_its_defaults() {
    let expected = Config::default().resolved();
    assert_eq!(accepted("scheduler_config:\n  gen_preemption:\n"), expected);
    assert_eq!(
        accepted("scheduler_config:\n  gen_preemption: null\n"),
        expected
    );
    assert_eq!(accepted("timing: ~\nserver:\n"), expected);
}

#[test]
fn a_duplicated_key_is_rejected_at_its_second_line() {
    let err = load("max_batch_size: 4\nmax_batch_size: 8\n").expect_err("duplicate");
    match &err {
        ConfigError::Parse { at, message, .. } => {
            assert_eq!(at.map(|p| p.line), Some(2), "{err}");
            assert!(message.contains("max_batch_size"), "{err}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn every_field_has_its_documented_default() {
    let c = accepted("");
    assert_eq!(c.backend, Backend::Model);
    assert_eq!(
        c.model_source(),
        ModelSource::Shape {
            name: "llama-8b".into(),
            seed: 0
        }
    );
    assert_eq!(c.max_batch_size, 128);
    assert_eq!(c.max_num_active_requests(), 128);
    assert_eq!(c.max_num_tokens, 8192);
    assert_eq!(c.max_context_tokens, 1_048_576);
    assert_eq!(c.kv_cache_config.tokens_per_block, 32);
    assert_eq!(c.kv_cache_config.max_tokens, 4_000_000);
    assert_eq!(c.kv_cache_config.sliding_window, None);
    assert_eq!(c.recurrent_state.slots, None);
    assert_eq!(c.drafter.slots, None);
    assert_eq!(c.drafter.window_tokens, 0);
    assert_eq!(c.parallel.tensor_parallel_size, 1);
    assert_eq!(c.parallel.pipeline_parallel_size, 1);
    assert!(!c.parallel.enable_attention_dp);
    let a = &c.scheduler_config.gen_admission;
    assert_eq!(a.policy, AdmissionPolicy::Auto);
    assert_eq!(a.ttft_percentile, 90.0);
    assert_eq!(a.target_window, 1000);
    assert_eq!(a.min_samples, 200);
    assert_eq!(a.max_waiting, 4096);
    assert_eq!(c.preemption().expect("valid"), Preemption::Off);
    let t = &c.timing;
    assert_eq!(
        (t.base_ms, t.per_request_ms, t.per_kv_token_ns),
        (60.0, 0.05, 1.0)
    );
    assert_eq!(
        (t.jump_above, t.jump_ms, t.tokens_per_step),
        (None, 0.0, 1.0)
    );
    assert_eq!(
        (
            t.transfer_base_ms,
            t.transfer_per_token_us,
            t.prefill_per_token_us
        ),
        (50.0, 2.0, 0.0)
    );
    let s = &c.server;
    assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", 8000));
    assert_eq!((s.stat_interval_s, s.request_timeout_s), (30.0, 600.0));
}

#[test]
fn max_num_active_requests_defaults_to_max_batch_size() {
    let c = accepted("max_batch_size: 64\n");
    assert_eq!(c.max_num_active_requests, Some(64));
    assert_eq!(c.max_num_active_requests(), 64);
    let c = accepted("max_batch_size: 64\nmax_num_active_requests: 48\n");
    assert_eq!(c.max_num_active_requests(), 48);
    // Resolution happens once, at load: the resolved YAML names the value.
    assert!(c
        .to_yaml()
        .expect("yaml")
        .contains("max_num_active_requests: 48"));
}

#[test]
fn a_partial_mapping_keeps_the_defaults_of_its_other_fields() {
    let c = accepted("kv_cache_config: { tokens_per_block: 64 }\nmodel: { path: /tmp/m }\n");
    assert_eq!(c.kv_cache_config.tokens_per_block, 64);
    assert_eq!(c.kv_cache_config.max_tokens, 4_000_000);
    assert_eq!(c.model_source(), ModelSource::Path("/tmp/m".into()));
}

#[test]
fn to_yaml_round_trips_for_defaults_and_non_defaults() {
    let mut custom = Config {
        backend: Backend::Cuda,
        max_batch_size: 144,
        ..Config::default()
    };
    custom.model.path = Some("/models/x".into());
    custom.kv_cache_config.sliding_window = Some(4096);
    custom.recurrent_state.slots = Some(200);
    custom.drafter.slots = Some(180);
    custom.drafter.window_tokens = 64;
    custom.scheduler_config.gen_admission.policy = AdmissionPolicy::Edf;
    custom.scheduler_config.gen_admission.ttft_percentile = 99.5;
    custom.scheduler_config.gen_preemption.target_output_tps = Some(35.0);
    custom.timing.jump_above = Some(128);
    custom.timing.jump_ms = 12.5;
    custom.server.port = 0;
    custom.validate().expect("custom config is valid");

    for cfg in [Config::default(), custom] {
        let yaml = cfg.to_yaml().expect("serialises");
        let back = Config::from_yaml_str(&yaml, "round-trip").expect("reads back");
        assert_eq!(back, cfg.clone().resolved(), "yaml was:\n{yaml}");
        assert_eq!(back.to_yaml().expect("serialises"), yaml);
    }
}

#[test]
fn tpot_budget_bounds_are_open_at_zero_and_closed_at_one() {
    for ok in ["0.001", "0.10", "1.0"] {
        let c = accepted(&preempt("tpot_budget", ok));
        assert!(matches!(c.preemption(), Ok(Preemption::TpotBudget(_))));
    }
    for bad in ["0", "-0.1", "1.01", ".nan", ".inf"] {
        rejected_at(
            &preempt("tpot_budget", bad),
            "scheduler_config.gen_preemption.tpot_budget",
            3,
        );
    }
}

#[test]
fn target_output_tps_must_be_positive_and_finite() {
    for ok in ["0.5", "35.0", "1000"] {
        let c = accepted(&preempt("target_output_tps", ok));
        assert!(matches!(c.preemption(), Ok(Preemption::TargetOutputTps(_))));
    }
    for bad in ["0", "-1", ".inf", ".nan"] {
        rejected_at(
            &preempt("target_output_tps", bad),
            "scheduler_config.gen_preemption.target_output_tps",
            3,
        );
    }
}

#[test]
fn ttft_percentile_is_strictly_between_0_and_100() {
    for ok in ["0.1", "50", "99.9"] {
        accepted(&admission(&format!("    ttft_percentile: {ok}\n")));
    }
    for bad in ["0", "100", "-5", "150"] {
        rejected_at(
            &admission(&format!("    ttft_percentile: {bad}\n")),
            "scheduler_config.gen_admission.ttft_percentile",
            3,
        );
    }
}

#[test]
fn min_samples_may_equal_but_not_exceed_target_window() {
    accepted(&admission("    target_window: 300\n    min_samples: 300\n"));
    let err = rejected_at(
        &admission("    target_window: 300\n    min_samples: 301\n"),
        "scheduler_config.gen_admission.min_samples",
        4,
    );
    assert!(err.to_string().contains("target_window"), "{err}");
}

#[test]
fn min_samples_defaulted_above_a_small_target_window_points_at_target_window() {
    // min_samples keeps its default 200; the only written key is target_window.
    let err = load(&admission("    target_window: 100\n")).expect_err("rejected");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, "scheduler_config.gen_admission.min_samples");
    assert_eq!(issue.at, None);
    assert_eq!(
        issue.primary_position(),
        Some(Position { line: 3, column: 5 })
    );
    assert!(err.to_string().contains("test.yaml:3:5"), "{err}");
}

#[test]
fn slot_and_batch_counts_must_be_at_least_one() {
    accepted("max_num_active_requests: 1\n");
    accepted("max_batch_size: 1\n");
    rejected_at("max_num_active_requests: 0\n", "max_num_active_requests", 1);
    rejected_at("backend: model\nmax_batch_size: 0\n", "max_batch_size", 2);
}

#[test]
fn tokens_per_block_is_a_power_of_two_of_at_least_one() {
    for ok in ["1", "16", "64"] {
        accepted(&format!("kv_cache_config:\n  tokens_per_block: {ok}\n"));
    }
    for bad in ["0", "24", "33"] {
        rejected_at(
            &format!("kv_cache_config:\n  tokens_per_block: {bad}\n"),
            "kv_cache_config.tokens_per_block",
            2,
        );
    }
}

#[test]
fn both_preemption_modes_are_rejected_naming_both_fields_and_lines() {
    let path = repo("tests/fixtures/config/invalid-both.yaml");
    let err = Config::from_file(&path).expect_err("both modes set");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, "scheduler_config.gen_preemption.tpot_budget");
    assert_eq!(
        issue.related,
        vec!["scheduler_config.gen_preemption.target_output_tps".to_owned()]
    );
    assert_eq!(issue.at, Some(Position { line: 5, column: 5 }));
    assert_eq!(
        issue.related_at,
        vec![Some(Position { line: 6, column: 5 })]
    );
    let text = err.to_string();
    assert!(text.contains("invalid-both.yaml:5:5"), "{text}");
    assert!(text.contains("tpot_budget"), "{text}");
    assert!(
        text.contains("target_output_tps at line 6, column 5"),
        "{text}"
    );
    assert!(text.contains("mutually exclusive"), "{text}");
}

#[test]
fn pipeline_parallelism_with_preemption_is_rejected() {
    let path = repo("tests/fixtures/config/pp-with-preemption.yaml");
    let err = Config::from_file(&path).expect_err("pp with preemption");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, "parallel.pipeline_parallel_size");
    assert_eq!(
        issue.at,
        Some(Position {
            line: 1,
            column: 38
        })
    );
    assert!(err.to_string().contains("target_output_tps"), "{err}");
    // Without preemption the same parallel layout is accepted (with a warning at serve).
    accepted("parallel: { tensor_parallel_size: 1, pipeline_parallel_size: 2 }\n");
}

#[test]
fn tensor_parallelism_on_cuda_is_refused_at_its_line() {
    let err = Config::from_yaml_str(
        "backend: cuda\nparallel: { tensor_parallel_size: 8 }\n",
        "tp.yaml",
    )
    .expect_err("cuda steps one GPU");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, "parallel.tensor_parallel_size");
    assert_eq!(
        issue.at,
        Some(Position {
            line: 2,
            column: 13
        })
    );
}

#[test]
fn attention_dp_with_preemption_is_rejected() {
    let path = repo("tests/fixtures/config/attention-dp-with-preemption.yaml");
    let err = Config::from_file(&path).expect_err("attention dp with preemption");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, "parallel.enable_attention_dp");
    assert_eq!(issue.at.map(|p| p.line), Some(2));
    assert!(err.to_string().contains("tpot_budget"), "{err}");
    accepted("parallel: { enable_attention_dp: true }\n");
}

#[test]
fn an_unknown_field_is_rejected_with_its_path_and_line() {
    let path = repo("tests/fixtures/config/unknown-field.yaml");
    let err = Config::from_file(&path).expect_err("typo");
    match &err {
        ConfigError::Parse { field, at, .. } => {
            assert_eq!(at.map(|p| p.line), Some(4), "{err}");
            assert_eq!(field.as_deref(), Some("kv_cache_config.max_tokns"), "{err}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("unknown-field.yaml:4:"), "{text}");
    assert!(text.contains("max_tokns"), "{text}");
}

#[test]
fn an_unknown_backend_is_rejected_listing_the_choices() {
    let path = repo("tests/fixtures/config/unknown-backend.yaml");
    let err = Config::from_file(&path).expect_err("no such backend");
    let text = err.to_string();
    assert!(text.contains("unknown-backend.yaml:2:"), "{text}");
    assert!(text.contains("tensorrt"), "{text}");
    assert!(text.contains("model") && text.contains("cuda"), "{text}");
}

#[test]
fn a_wrongly_typed_value_is_a_positioned_parse_error() {
    let err = load("server:\n  host: 0.0.0.0\n  port: eighty\n").expect_err("bad port");
    match &err {
        ConfigError::Parse { field, at, .. } => {
            assert_eq!(at.map(|p| p.line), Some(3), "{err}");
            assert_eq!(field.as_deref(), Some("server.port"), "{err}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    assert!(err.to_string().contains("(read `eighty`)"), "{err}");
}

#[test]
fn an_over_indented_line_folded_into_the_value_above_is_pointed_out() {
    // YAML reads the second line as the rest of a plain scalar, not as a key.
    let err = load("max_batch_size: 64\n  bad_indent 1\n").expect_err("not a number");
    let text = err.to_string();
    assert!(text.contains("test.yaml:1:17: max_batch_size"), "{text}");
    assert!(text.contains("runs on to line 2"), "{text}");
    assert!(text.contains("indented too far"), "{text}");
}

#[test]
fn an_unknown_model_shape_is_rejected_listing_the_shapes() {
    let err = rejected_at("model:\n  shape: llama-70b\n", "model.shape", 2);
    assert!(err.to_string().contains("llama-1b"), "{err}");
}

#[test]
fn every_broken_rule_is_reported_at_once() {
    let err = load("max_batch_size: 0\nkv_cache_config: { tokens_per_block: 3 }\n")
        .expect_err("two problems");
    let fields: Vec<&str> = err.issues().iter().map(|i| i.field.as_str()).collect();
    assert_eq!(
        fields,
        ["max_batch_size", "kv_cache_config.tokens_per_block"]
    );
}

#[test]
fn the_shipped_config_files_validate() {
    let dir = repo("config");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("config/ exists") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            seen.push(path.file_name().map(|n| n.to_string_lossy().into_owned()));
        }
    }
    seen.sort();
    for name in ["default.yaml", "preempt-target.yaml", "preempt-tpot.yaml"] {
        assert!(seen.contains(&Some(name.to_owned())), "{name} missing");
    }
    let tpot = Config::from_file(dir.join("preempt-tpot.yaml")).expect("valid");
    assert_eq!(
        tpot.preemption().expect("valid"),
        Preemption::TpotBudget(0.10)
    );
    let target = Config::from_file(dir.join("preempt-target.yaml")).expect("valid");
    assert_eq!(
        target.preemption().expect("valid"),
        Preemption::TargetOutputTps(35.0)
    );
}

#[test]
fn check_config_prints_the_resolved_config_or_the_error() {
    let host = genslot::config::Host::current();
    let checked = check_config(repo("config/preempt-tpot.yaml"), &host).expect("valid");
    assert!(checked.warnings.is_empty(), "{:?}", checked.warnings);
    let yaml = checked.yaml;
    let back = Config::from_yaml_str(&yaml, "printed").expect("printed config loads");
    assert_eq!(
        back.preemption().expect("valid"),
        Preemption::TpotBudget(0.10)
    );
    assert!(yaml.contains("max_num_active_requests: 128"), "{yaml}");
    assert!(
        yaml.contains("initial_gain: 1"),
        "tpot_budget's start for g: {yaml}"
    );

    let err =
        check_config(repo("tests/fixtures/config/invalid-both.yaml"), &host).expect_err("invalid");
    assert!(err.to_string().contains("mutually exclusive"), "{err}");

    let missing = check_config(repo("config/no-such-file.yaml"), &host).expect_err("missing");
    assert!(matches!(missing, ConfigError::Io { .. }));
    assert!(
        missing.to_string().contains("no-such-file.yaml"),
        "{missing}"
    );
}

#[test]
fn validate_on_a_config_built_in_code_names_fields_without_positions() {
    let mut cfg = Config::default();
    cfg.scheduler_config.gen_preemption.tpot_budget = Some(0.1);
    cfg.parallel.pipeline_parallel_size = 4;
    let err = cfg.validate().expect_err("pp with preemption");
    let issue = &err.issues()[0];
    assert_eq!(issue.field, "parallel.pipeline_parallel_size");
    assert_eq!(issue.primary_position(), None);
}

#[test]
fn remaining_bounds_reject_the_bad_side_and_accept_the_edge() {
    // (section, key, edge value accepted, value rejected)
    let cases = [
        ("kv_cache_config", "sliding_window", "1", "0"),
        ("kv_cache_config", "max_tokens", "32", "31"),
        ("recurrent_state", "slots", "1", "0"),
        ("drafter", "slots", "1", "0"),
        ("parallel", "tensor_parallel_size", "1", "0"),
        ("parallel", "pipeline_parallel_size", "1", "0"),
        ("timing", "base_ms", "0.001", "0"),
        ("timing", "per_request_ms", "0", "-0.01"),
        ("timing", "per_kv_token_ns", "0", "-1"),
        ("timing", "jump_ms", "0", "-1"),
        ("timing", "tokens_per_step", "1", "0.9"),
        ("timing", "transfer_base_ms", "0", "-1"),
        ("timing", "transfer_per_token_us", "0", "-1"),
        ("timing", "prefill_per_token_us", "0", "-1"),
        ("server", "stat_interval_s", "0.5", "0"),
        ("server", "request_timeout_s", "0.5", "0"),
        ("server", "host", "localhost", "\"\""),
    ];
    for (section, key, ok, bad) in cases {
        accepted(&format!("{section}:\n  {key}: {ok}\n"));
        rejected_at(
            &format!("{section}:\n  {key}: {bad}\n"),
            &format!("{section}.{key}"),
            2,
        );
    }
    for (key, ok, bad) in [
        ("max_num_tokens", "1", "0"),
        ("max_context_tokens", "1", "0"),
    ] {
        accepted(&format!("{key}: {ok}\n"));
        rejected_at(&format!("{key}: {bad}\n"), key, 1);
    }
    accepted("scheduler_config:\n  gen_admission: { max_waiting: 1 }\n");
    rejected_at(
        "scheduler_config:\n  gen_admission: { max_waiting: 0 }\n",
        "scheduler_config.gen_admission.max_waiting",
        2,
    );
}

/// `serve --backend cuda` on a file that says `backend: model`: the error names the flag,
/// not the file's line, whose value is not the one that broke the rule.
#[test]
fn a_field_set_by_a_flag_is_named_by_its_flag_not_pointed_at_in_the_file() {
    let path = repo("config/tp2-model.yaml");
    let text = std::fs::read_to_string(&path).expect("read");
    let mut cfg = Config::from_yaml_str(&text, "tp2-model.yaml").expect("valid");
    cfg.backend = Backend::Cuda;
    let host = genslot::config::Host::current();
    let err = cfg
        .check_for_serving(&text, "tp2-model.yaml", &host, &[("backend", "--backend")])
        .expect_err("tensor parallel on cuda");
    let issue = &err.issues()[0];
    assert_eq!(issue.related, vec!["backend".to_owned()]);
    assert_eq!(issue.related_at, vec![None]);
    let text = err.to_string();
    assert!(text.contains("[backend from --backend]"), "{text}");
    assert!(!text.contains("backend at line"), "{text}");
}

#[test]
fn gain_from_takes_any_or_paused_with_tpot_budget_and_resolves_to_any() {
    let yaml = |from: &str| {
        format!(
            "scheduler_config:\n  gen_preemption:\n    tpot_budget: 0.1\n    gain_from: {from}\n"
        )
    };
    let held = accepted(&yaml("paused")).resolved();
    assert_eq!(
        held.scheduler_config.gen_preemption.gain_from,
        Some(GainFrom::Paused)
    );
    let resolved = accepted(&preempt("tpot_budget", "0.1")).resolved();
    assert_eq!(
        resolved.scheduler_config.gen_preemption.gain_from,
        Some(GainFrom::Any),
        "SPEC §4.3's rule, written out"
    );
    let err = rejected_at(
        &yaml("sometimes"),
        "scheduler_config.gen_preemption.gain_from",
        4,
    );
    assert!(err.to_string().contains("paused"), "{err}");
    rejected_at(
        &preempt("gain_from", "paused"),
        "scheduler_config.gen_preemption.gain_from",
        3,
    );
}

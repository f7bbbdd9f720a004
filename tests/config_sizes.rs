//! Absurd sizes and settings that do nothing: every config either fails `check-config` with
//! the field's position or starts `serve`; none aborts or balloons the process.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use genslot::actors::{ActorEngine, StartOptions};
use genslot::config::{Config, ConfigError, Host};
use genslot::gpu::model::ModelBackend;
use genslot::server::engine::Engine;
use genslot::timing::{Clock, RealClock};
use proptest::prelude::*;

fn genslot() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_genslot"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// Runs `genslot ARGS… FILE` on `yaml`; returns (exit code, stderr).
fn run_on(args: &[&str], yaml: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = genslot().args(args).arg(&path).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn absurd_batch_sizes_fail_check_config_and_serve_with_the_position() {
    for value in ["4294967295", "1000000000"] {
        let yaml = format!("max_batch_size: {value}\n");
        let (code, err) = run_on(&["check-config"], &yaml);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("c.yaml:1:1: max_batch_size: must be at most 65536"),
            "{err}"
        );
        // `serve` refuses before allocating anything: an error, not an abort.
        let (code, err) = run_on(&["serve", "--port", "0", "--config"], &yaml);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("max_batch_size"), "{err}");
    }
}

#[test]
fn a_kv_pool_past_32_bit_page_ids_is_an_error_not_a_silent_clamp() {
    let (code, err) = run_on(
        &["check-config"],
        "kv_cache_config:\n  max_tokens: 1000000000000000\n",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(":2:3: kv_cache_config.max_tokens"), "{err}");
    assert!(err.contains("pages"), "{err}");
}

#[test]
fn tensor_parallelism_and_a_missing_checkpoint_are_errors_at_their_field() {
    let (code, err) = run_on(
        &["check-config"],
        "backend: cuda\nparallel:\n  tensor_parallel_size: 8\n",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(":3:3: parallel.tensor_parallel_size"), "{err}");
    let (code, err) = run_on(
        &["check-config"],
        "backend: cuda\nmodel:\n  path: /no/such/checkpoint\n",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(":3:3: model.path"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn a_field_without_effect_on_the_backend_is_one_warning_naming_it() {
    let (code, err) = run_on(
        &["check-config"],
        "model:\n  seed: 7\n  path: /no/such/checkpoint\n",
    );
    assert_eq!(code, Some(0), "{err}");
    let warnings: Vec<&str> = err.lines().collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(
        warnings[0].contains(":2:3: warning: model.seed: has no effect"),
        "{err}"
    );
    assert!(
        warnings[1].contains(":3:3: warning: model.path: has no effect"),
        "{err}"
    );
    let (code, err) = run_on(&["check-config"], "backend: cuda\ntiming:\n  base_ms: 9\n");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(":3:3: warning: timing.base_ms: has no effect on backend `cuda`"),
        "{err}"
    );
}

#[test]
fn a_config_that_cannot_be_read_is_named_once() {
    let out = genslot()
        .args(["serve", "--config", "config/no-such-file.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

/// Values from harmless to absurd for a field, as YAML text.
fn size() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just("0".to_owned()),
        1 => Just("1".to_owned()),
        6 => (1u64..300).prop_map(|v| v.to_string()),
        1 => Just("65536".to_owned()),
        1 => Just("65537".to_owned()),
        1 => Just("1000000000".to_owned()),
        1 => Just("4294967295".to_owned()),
        1 => Just("1000000000000000".to_owned()),
        1 => Just("-1".to_owned()),
        1 => Just("1e9".to_owned()),
    ]
}

fn seconds() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just("0".to_owned()),
        1 => Just("0.05".to_owned()),
        4 => Just("30".to_owned()),
        1 => Just("1e300".to_owned()),
        1 => Just(".nan".to_owned()),
        1 => Just("-5".to_owned()),
        1 => Just(".inf".to_owned()),
    ]
}

const SIZE_FIELDS: &[&str] = &[
    "max_batch_size",
    "max_num_active_requests",
    "max_num_tokens",
    "max_context_tokens",
    "kv_cache_config.max_tokens",
    "kv_cache_config.tokens_per_block",
    "recurrent_state.slots",
    "drafter.slots",
    "drafter.window_tokens",
    "scheduler_config.gen_admission.target_window",
    "scheduler_config.gen_admission.min_samples",
    "scheduler_config.gen_admission.max_waiting",
    "server.max_connections",
    "server.default_max_tokens",
    "server.max_body_bytes",
];

const SECOND_FIELDS: &[&str] = &[
    "server.stat_interval_s",
    "server.request_timeout_s",
    "server.drain_timeout_s",
    "server.header_read_timeout_s",
    "timing.base_ms",
    "timing.jump_ms",
    "timing.tokens_per_step",
];

/// `a.b.c: v` lines as nested YAML (one mapping per section, in flow style).
fn yaml_of(fields: &[(&str, String)]) -> String {
    let mut top: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    let mut out = String::new();
    for (path, value) in fields {
        match path.split_once('.') {
            None => out.push_str(&format!("{path}: {value}\n")),
            Some((section, rest)) => top.entry(section).or_default().push(nest(rest, value)),
        }
    }
    for (section, items) in top {
        out.push_str(&format!("{section}: {{ {} }}\n", items.join(", ")));
    }
    out
}

fn nest(path: &str, value: &str) -> String {
    match path.split_once('.') {
        None => format!("{path}: {value}"),
        Some((head, rest)) => format!("{head}: {{ {} }}", nest(rest, value)),
    }
}

fn configs() -> impl Strategy<Value = String> {
    let sizes = proptest::sample::subsequence(SIZE_FIELDS, 0..5)
        .prop_flat_map(|f| (Just(f.clone()), proptest::collection::vec(size(), f.len())));
    let secs = proptest::sample::subsequence(SECOND_FIELDS, 0..3).prop_flat_map(|f| {
        (
            Just(f.clone()),
            proptest::collection::vec(seconds(), f.len()),
        )
    });
    (sizes, secs).prop_map(|((sf, sv), (tf, tv))| {
        // Nested sections must each appear once: group by their first key.
        let mut fields: Vec<(&str, String)> = sf.into_iter().zip(sv).collect();
        fields.extend(tf.into_iter().zip(tv));
        fields.retain(|(p, _)| p.matches('.').count() <= 1 || p.starts_with("scheduler_config"));
        let (sched, rest): (Vec<_>, Vec<_>) = fields
            .into_iter()
            .partition(|(p, _)| p.starts_with("scheduler_config"));
        let mut text = yaml_of(&rest);
        if !sched.is_empty() {
            let items: Vec<String> = sched
                .iter()
                .map(|(p, v)| format!("{}: {v}", p.rsplit('.').next().unwrap()))
                .collect();
            text.push_str(&format!(
                "scheduler_config: {{ gen_admission: {{ {} }} }}\n",
                items.join(", ")
            ));
        }
        text
    })
}

fn every_issue_is_positioned(e: &ConfigError) -> bool {
    match e {
        ConfigError::Parse { at, .. } => at.is_some(),
        ConfigError::Invalid { issues, .. } => {
            !issues.is_empty() && issues.iter().all(|i| i.primary_position().is_some())
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any generated config fails with a position for every problem, or starts the worker
    /// (the pools and every actor) and shuts it down.
    #[test]
    fn any_config_fails_with_a_position_or_starts_the_worker(text in configs()) {
        let host = Host { memory_bytes: Some(16 << 30), exists: |_| false };
        let checked = Config::from_yaml_str(&text, "gen.yaml")
            .and_then(|cfg| cfg.check_for_serving(&text, "gen.yaml", &host, &[]).map(|_| cfg));
        match checked {
            Err(e) => prop_assert!(every_issue_is_positioned(&e), "{text}\n{e}"),
            Ok(cfg) => {
                let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
                let backend = ModelBackend::from_config(&cfg, clock.clone());
                let engine = ActorEngine::start(&cfg, Box::new(backend), clock, StartOptions::default());
                let engine = match engine {
                    Ok(e) => e,
                    // The setup decision may refuse a combination; it says why.
                    Err(e) => { prop_assert!(!e.to_string().is_empty()); return Ok(()); }
                };
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(engine.shutdown(Duration::ZERO));
            }
        }
    }
}

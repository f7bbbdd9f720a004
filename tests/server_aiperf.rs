//! AIPerf (NVIDIA's load tool, behind AgentX) against the server and the mock engine,
//! counting tokens itself with the shipped word tokenizer (`assets/word-tokenizer`).
//! Ignored by default: it needs aiperf installed. Run with
//! `GENSLOT_AIPERF=<aiperf executable> cargo test --test server_aiperf -- --ignored --nocapture`
//! (`GENSLOT_AIPERF_TOKENIZER=<dir>` for another tokenizer).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use genslot::server::mock::{MockConfig, MockEngine};
use genslot::server::{serve, App};
use serde_json::Value;

const REQUESTS: u64 = 40;
const ISL: u64 = 64;
const OSL: u64 = 32;

fn env_path(name: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("set {name} (see this file's header)"))
}

/// Runs one aiperf profile and returns its `profile_export_aiperf.json`.
async fn profile(endpoint_type: &str) -> Value {
    let engine = MockEngine::new(MockConfig {
        token_interval: Duration::from_millis(2),
        ..MockConfig::default()
    });
    let metrics = genslot::metrics::install_recorder().expect("recorder");
    let app = App::new(Arc::new(engine.clone()), metrics, "genslot-test".into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app, async {
        let _ = stopped.await;
    }));

    let out = tempfile::tempdir().expect("tempdir");
    let status = tokio::process::Command::new(env_path("GENSLOT_AIPERF"))
        .args(["profile", "--model", "genslot-test", "--url", &url])
        .args(["--endpoint-type", endpoint_type, "--streaming"])
        .arg("--tokenizer")
        .arg(
            std::env::var_os("GENSLOT_AIPERF_TOKENIZER")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(concat!(
                        env!("CARGO_MANIFEST_DIR"),
                        "/assets/word-tokenizer"
                    ))
                }),
        )
        .args(["--isl", &ISL.to_string(), "--osl", &OSL.to_string()])
        .args([
            "--request-count",
            &REQUESTS.to_string(),
            "--concurrency",
            "4",
        ])
        .args(["--random-seed", "1", "--ui", "none"])
        .args(["--extra-inputs", "ignore_eos:true"])
        .arg("--output-artifact-dir")
        .arg(out.path())
        .status()
        .await
        .expect("aiperf runs");
    assert!(status.success(), "aiperf exited with {status}");

    let _ = stop.send(());
    server.await.expect("server task").expect("serve");
    assert_eq!(engine.live(), 0);
    assert!(engine.cancelled().is_empty());
    let export = out.path().join("profile_export_aiperf.json");
    let text = std::fs::read_to_string(&export).expect("aiperf export");
    serde_json::from_str(&text).expect("export is JSON")
}

fn check(export: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(export).unwrap_or_default()
    );
    assert_eq!(
        export["request_count"]["avg"], REQUESTS as f64,
        "all requests counted"
    );
    let errors = export["error_request_count"]["avg"].as_f64().unwrap_or(0.0);
    assert_eq!(errors, 0.0, "no request failed");
    assert!(export["time_to_first_token"]["avg"].as_f64().is_some());
    // aiperf counts output tokens with its own tokenizer: every request's count equals its
    // `usage` (prompt counts differ on chat, where `usage` includes the chat template).
    assert_eq!(export["output_sequence_length"]["min"], OSL as f64);
    assert_eq!(export["output_sequence_length"]["max"], OSL as f64);
    assert_eq!(export["usage_completion_tokens_diff_pct"]["max"], 0.0);
}

#[tokio::test]
#[ignore = "needs aiperf (GENSLOT_AIPERF)"]
async fn aiperf_completions_streaming_runs_clean() {
    check(&profile("completions").await);
}

#[tokio::test]
#[ignore = "needs aiperf (GENSLOT_AIPERF)"]
async fn aiperf_chat_streaming_runs_clean() {
    check(&profile("chat").await);
}

//! How a run ends for the shell: a run that measured no completed request exits non-zero
//! with a message that says why (its summary still written), a server that is not there is
//! named as such before anything is sent (with or without --model), so is a URL that is not
//! one, an OpenAI base URL (`…/v1`) reaches the same routes as the root, and the model
//! defaults to the one the server lists.

mod common;

use common::cli::{args, loadgen};
use common::Behavior;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_completes_no_measured_request_fails_with_a_message() {
    let mock = common::start(|_| Behavior::Hang, None).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = loadgen(args(&[
        "--url",
        &mock.url(),
        "--fixed",
        "8,4",
        "--concurrency",
        "2",
        "--duration",
        "300ms",
        "--grace",
        "200ms",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ]))
    .await;
    assert!(!out.status.success(), "exit status {}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no measured request completed"), "{err}");
    assert!(err.contains("longer --duration or --grace"), "{err}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(summary["request_count"]["avg"], 0.0);
    assert_eq!(summary["error_request_count"]["avg"], 0.0);
    assert_eq!(summary["cancelled_request_count"]["avg"], 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_model_the_servers_listed_model_is_sent() {
    let mock = common::start(|_| Behavior::stream(0, 0), None).await;
    let out = loadgen(args(&[
        "--url",
        &mock.url(),
        "--fixed",
        "8,4",
        "--concurrency",
        "1",
        "--max-requests",
        "2",
        "--no-progress",
    ]))
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mock.seen().iter().all(|s| s.body["model"] == "mock"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_base_url_ending_in_v1_reaches_the_same_routes_as_the_root() {
    let mock = common::start(|_| Behavior::stream(0, 0), None).await;
    let out = loadgen(args(&[
        "--url",
        &format!("{}/v1/", mock.url()),
        "--fixed",
        "8,4",
        "--concurrency",
        "1",
        "--max-requests",
        "2",
        "--no-progress",
    ]))
    .await;
    // The mock answers /v1/models and /v1/completions only: /v1/v1/… would be a 404.
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|s| s.path == "/v1/completions" && s.body["model"] == "mock"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_does_not_parse_is_refused_with_the_expected_form() {
    let out = loadgen(args(&[
        "--url",
        "notaurl",
        "--fixed",
        "8,4",
        "--concurrency",
        "1",
        "--no-progress",
    ]))
    .await;
    assert!(!out.status.success(), "exit status {}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a URL"), "{err}");
    assert!(err.contains("e.g. http://127.0.0.1:8000"), "{err}");
    assert!(!err.contains("builder error"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_model_a_closed_port_is_reported_as_unreachable_not_as_a_missing_model() {
    let url = common::closed_port_url().await;
    let out = loadgen(args(&[
        "--url",
        &url,
        "--fixed",
        "8,4",
        "--concurrency",
        "1",
        "--no-progress",
    ]))
    .await;
    assert!(!out.status.success(), "exit status {}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot reach the server at {url}: connection refused"
        )),
        "{err}"
    );
    assert!(!err.contains("--model"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_model_a_closed_port_is_refused_before_the_run_starts() {
    let url = common::closed_port_url().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = loadgen(args(&[
        "--url",
        &url,
        "--model",
        "m",
        "--fixed",
        "8,4",
        "--concurrency",
        "1",
        "--duration",
        "300ms",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ]))
    .await;
    assert!(!out.status.success(), "exit status {}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot reach the server at {url}: connection refused"
        )),
        "{err}"
    );
    assert!(!err.contains("--duration"), "{err}");
    assert!(!json.exists(), "no run, so no summary");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty(), "no table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_every_request_fails_says_so_not_that_more_time_would_help() {
    let mock = common::start(|_| Behavior::Status(500), None).await;
    let out = loadgen(args(&[
        "--url",
        &mock.url(),
        "--fixed",
        "8,4",
        "--concurrency",
        "1",
        "--max-requests",
        "3",
        "--no-progress",
    ]))
    .await;
    assert!(!out.status.success(), "exit status {}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("all 3 failed (3 http_500)"), "{err}");
    assert!(!err.contains("--duration"), "{err}");
}

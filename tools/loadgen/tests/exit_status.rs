//! How a run ends for the shell: a run that measured no completed request exits non-zero
//! with a message (its summary still written), and the model defaults to the one the server
//! lists.

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

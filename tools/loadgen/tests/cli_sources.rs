//! Every source the command line offers, through the binary: open-loop traces, bad files,
//! missing arguments.

mod common;

use std::path::PathBuf;

use common::cli::{args, loadgen};
use common::Behavior;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn summary_of(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("summary")).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_and_azure_traces_replay_open_loop_to_the_last_row() {
    let mock = common::start(|_| Behavior::stream(1, 1), None).await;
    let dir = std::env::temp_dir().join(format!("loadgen-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (flag, file, rows, isl) in [
        ("--mooncake", "mooncake.jsonl", 4.0, 2600.0),
        ("--azure", "azure.csv", 3.0, 898.0),
    ] {
        let json = dir.join(format!("{file}.json"));
        let mut a = args(&[
            "--url",
            &mock.url(),
            "--rate-scale",
            "4",
            "--no-progress",
            "--json",
        ]);
        a.push(json.display().to_string());
        a.push(flag.to_owned());
        a.push(fixture(file).display().to_string());
        let out = loadgen(a).await;
        assert!(
            out.status.success(),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = summary_of(&json);
        assert_eq!(s["stop_reason"], "source_exhausted", "{flag}");
        assert_eq!(s["request_count"]["avg"], rows, "{flag}");
        assert_eq!(s["total_isl"]["avg"], isl, "{flag}");
        assert_eq!(s["warmup_excluded"], 0, "{flag}: open loop has no warm-up");
        assert!(s["run"]["concurrency"].is_null());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_trace_is_reported_with_its_file_and_line() {
    let bad = fixture("mooncake_bad.jsonl");
    let mut a = args(&["--url", "http://127.0.0.1:9", "--no-progress", "--mooncake"]);
    a.push(bad.display().to_string());
    let out = loadgen(a).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mooncake_bad.jsonl") && err.contains('2'),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_sources_need_a_concurrency() {
    let out = loadgen(args(&[
        "--url",
        "http://127.0.0.1:9",
        "--synthetic",
        "--no-progress",
    ]))
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--concurrency"));
}

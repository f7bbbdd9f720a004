//! `--context-scale` / `--max-context`: loadgen sends the prompts genslot's context transform
//! gives (the function `genslot sim` applies), and refuses to transform `--fixed` lengths.

mod common;

use std::path::PathBuf;

use common::cli::{args, loadgen};
use common::Behavior;
use genslot::workload::{load_trace, ContextTransform, Trace, TraceFormat};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transformed_trace_sends_the_prompt_lengths_the_simulator_replays() {
    let mock = common::start(|_| Behavior::stream(1, 1), None).await;
    let dir = tempfile_dir("loadgen-ctx");
    let json = dir.join("summary.json");
    let mut a = args(&[
        "--url",
        &mock.url(),
        "--rate-scale",
        "4",
        "--no-progress",
        "--context-scale",
        "0.5",
        "--max-context",
        "500",
        "--json",
    ]);
    a.push(json.display().to_string());
    a.push("--mooncake".into());
    a.push(fixture("mooncake.jsonl").display().to_string());
    let out = loadgen(a).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("summary")).expect("JSON");

    let mut trace = load_trace(&fixture("mooncake.jsonl"), Some(TraceFormat::Mooncake)).unwrap();
    ContextTransform::new(Some(0.5), Some(500))
        .unwrap()
        .apply(&mut trace);
    let Trace::Requests { requests, .. } = trace else {
        panic!("mooncake is open loop")
    };
    let want: u32 = requests.iter().map(|r| r.input_tokens).sum();
    // 1200, 600, 700, 100 -> 600, 300, 350, 50 -> capped at 500.
    assert_eq!(want, 500 + 300 + 350 + 50);
    assert_eq!(s["total_isl"]["avg"], f64::from(want));
    assert!(s["run"]["source"]
        .as_str()
        .unwrap()
        .contains("contexts x0.5, at most 500 tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lengths_are_not_transformed_and_bad_settings_are_refused() {
    for (extra, want) in [
        (
            vec!["--fixed", "64,8", "-c", "1"],
            "give --fixed the lengths you want",
        ),
        (vec!["--synthetic", "-c", "1"], "must be in (0, 1]"),
    ] {
        let mut a = args(&["--url", "http://127.0.0.1:9", "--no-progress"]);
        a.extend(args(&extra));
        let scale = if extra[0] == "--fixed" { "0.5" } else { "1.5" };
        a.extend(args(&["--context-scale", scale]));
        let out = loadgen(a).await;
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

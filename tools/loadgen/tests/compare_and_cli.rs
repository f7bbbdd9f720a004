//! `loadgen compare` and the binary end to end: files written, table printed.

mod common;

use std::process::Command;

use common::Behavior;
use loadgen::compare::{compare_values, render};
use serde_json::json;

fn summary(ttft_p90: f64, tokens_per_s: f64, pauses: Option<f64>) -> serde_json::Value {
    let mut v = json!({
        "time_to_first_token": {"unit": "ms", "avg": 100.0, "p50": 90.0, "p90": ttft_p90, "p99": 400.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": tokens_per_s},
        "request_count": {"unit": "requests", "avg": 50.0},
    });
    if let Some(p) = pauses {
        v["server_metrics"] = json!({"pauses": p, "resumes_normal": 0.0, "resumes_forced": 0.0});
    }
    v
}

#[test]
fn compare_reports_absolute_and_relative_deltas_of_b_against_a() {
    let rows = compare_values(
        &summary(200.0, 1000.0, None),
        &summary(150.0, 900.0, Some(12.0)),
    );
    let row = |m: &str| {
        rows.iter()
            .find(|r| r.metric == m)
            .unwrap_or_else(|| panic!("row {m}"))
    };
    let p90 = row("TTFT p90 (ms)");
    assert_eq!(
        (p90.a, p90.b, p90.delta),
        (Some(200.0), Some(150.0), Some(-50.0))
    );
    assert_eq!(p90.delta_pct, Some(-25.0));
    assert_eq!(row("output tokens/s").delta_pct, Some(-10.0));
    let pauses = row("server pauses");
    assert_eq!((pauses.a, pauses.b, pauses.delta), (None, Some(12.0), None));
    assert!(
        rows.iter().all(|r| r.metric != "ITL p90 (ms)"),
        "absent in both: no row"
    );
    let table = render(&rows, "a.json", "b.json");
    assert!(table.contains("-25.0%"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("TTFT p90 (ms)") && l.contains("-50.00")),
        "{table}"
    );
}

#[test]
fn compare_names_the_file_it_cannot_read() {
    let dir = std::env::temp_dir().join(format!("loadgen-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{not json").expect("write");
    let err = loadgen::compare::compare_files(&bad, &bad).expect_err("bad JSON");
    assert!(err.to_string().contains("bad.json"), "{err}");
    let missing = dir.join("missing.json");
    let err = loadgen::compare::compare_files(&missing, &bad).expect_err("missing file");
    assert!(err.to_string().contains("missing.json"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_writes_summary_and_records_and_compares_two_runs() {
    let mock = common::start(|_| Behavior::stream(5, 0), None).await;
    let dir = std::env::temp_dir().join(format!("loadgen-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = env!("CARGO_BIN_EXE_loadgen");
    let url = mock.url();
    let run_dir = dir.clone();
    let run = move |name: &str| {
        let dir = run_dir;
        let json = dir.join(format!("{name}.json"));
        let records = dir.join(format!("{name}.jsonl"));
        let out = Command::new(exe)
            .args([
                "--url",
                &url,
                "--synthetic",
                "--concurrency",
                "2",
                "--max-requests",
                "6",
            ])
            .args([
                "--idle-cap",
                "0s",
                "--duration",
                "60s",
                "--no-progress",
                "--seed",
                "3",
            ])
            .arg("--json")
            .arg(&json)
            .arg("--records")
            .arg(&records)
            .output()
            .expect("run loadgen");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            json,
            records,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (a_json, a_records, table) = tokio::task::spawn_blocking(move || run("a"))
        .await
        .expect("join");
    assert!(table.contains("time_to_first_token"), "{table}");

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a_json).expect("summary file"))
            .expect("summary JSON");
    assert_eq!(summary["request_count"]["avg"], 6.0);
    assert_eq!(summary["time_to_first_token"]["unit"], "ms");
    for key in ["avg", "p50", "p90", "p99", "min", "max", "std"] {
        assert!(summary["time_to_first_token"][key].is_number(), "{key}");
        assert!(summary["inter_token_latency"][key].is_number(), "{key}");
    }
    assert!(summary["errors_by_kind"].is_object());
    let warmups = summary["warmup_excluded"]
        .as_u64()
        .expect("warmup_excluded");

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&a_records)
        .expect("records file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect();
    assert_eq!(lines.len() as u64, 6 + warmups);
    let profiling = lines
        .iter()
        .filter(|l| l["metadata"]["benchmark_phase"] == "profiling")
        .count();
    assert_eq!(profiling, 6);
    assert!(lines
        .iter()
        .all(|l| l["metrics"]["time_to_first_token"]["unit"] == "ms"));

    let compare = Command::new(exe)
        .arg("compare")
        .arg(&a_json)
        .arg(&a_json)
        .output()
        .expect("compare");
    assert!(compare.status.success());
    let text = String::from_utf8_lossy(&compare.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("TTFT p90 (ms)") && l.contains("+0.0%")),
        "{text}"
    );
}

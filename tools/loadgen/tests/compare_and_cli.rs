//! `loadgen compare` and the binary end to end: files written, table printed.

mod common;

use std::process::Command;

use common::Behavior;
use loadgen::compare::{compare_values, render, Comparison};
use serde_json::json;

fn summary(ttft_p90: f64, tokens_per_s: f64, pauses: Option<f64>) -> serde_json::Value {
    let mut v = json!({
        "time_to_first_token": {"unit": "ms", "avg": 100.0, "p50": 90.0, "p90": ttft_p90, "p99": 400.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": tokens_per_s},
        "request_count": {"unit": "requests", "avg": 50.0},
        "loadgen_summary_version": 2,
        "warmup_excluded": 0,
    });
    if let Some(p) = pauses {
        v["server_metrics"] = json!({"pauses": p, "resumes_normal": 0.0, "resumes_forced": 0.0});
    }
    v
}

#[test]
fn compare_reports_absolute_and_relative_deltas_of_b_against_a() {
    let cmp = compare_values(
        &summary(200.0, 1000.0, None),
        &summary(150.0, 900.0, Some(12.0)),
    );
    assert!(cmp.notes.is_empty(), "{:?}", cmp.notes);
    let rows = &cmp.rows;
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
    let table = render(&cmp, "a.json", "b.json");
    assert!(table.contains("-25.0%"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("TTFT p90 (ms)") && l.contains("-50.00")),
        "{table}"
    );
}

fn row(cmp: &Comparison, metric: &str) -> (Option<f64>, Option<f64>) {
    let r = cmp
        .rows
        .iter()
        .find(|r| r.metric == metric)
        .unwrap_or_else(|| panic!("no row {metric} in {:?}", cmp.rows));
    (r.a, r.b)
}

#[test]
fn compare_shows_completed_failed_and_cancelled_requests_as_separate_rows() {
    let counts = |completed: f64, failed: f64, cancelled: f64| {
        json!({
            "loadgen_summary_version": 2,
            "warmup_excluded": 64,
            "request_throughput": {"unit": "requests/sec", "avg": completed / 100.0},
            "request_count": {"unit": "requests", "avg": completed},
            "error_request_count": {"unit": "requests", "avg": failed},
            "cancelled_request_count": {"unit": "requests", "avg": cancelled},
        })
    };
    let cmp = compare_values(&counts(40.0, 1.0, 50.0), &counts(45.0, 0.0, 52.0));
    assert_eq!(row(&cmp, "requests completed"), (Some(40.0), Some(45.0)));
    assert_eq!(row(&cmp, "requests failed"), (Some(1.0), Some(0.0)));
    assert_eq!(
        row(&cmp, "requests cancelled at end"),
        (Some(50.0), Some(52.0))
    );
    assert_eq!(row(&cmp, "completed requests/s"), (Some(0.4), Some(0.45)));
    let table = render(&cmp, "a.json", "b.json");
    assert!(table.contains("requests cancelled at end"), "{table}");
    // Version 2 timed its throughputs over a window that spanned failed and cancelled
    // requests too; version 3 over the completed ones only, so the table says so.
    assert_eq!(cmp.notes.len(), 2, "{:?}", cmp.notes);
    assert!(cmp
        .notes
        .iter()
        .all(|n| n.contains("throughputs as written")));
    let mut current = counts(40.0, 1.0, 50.0);
    current["loadgen_summary_version"] = json!(3);
    let cmp = compare_values(&current, &current);
    assert!(cmp.notes.is_empty(), "{:?}", cmp.notes);
}

#[test]
fn compare_reads_older_loadgen_summaries_in_todays_counts_and_says_so() {
    // Before loadgen_summary_version: request_count was every request sent, the completed
    // ones were good_request_count; the oldest counted run-end cancellations as errors.
    let oldest = json!({
        "warmup_excluded": 64,
        "request_count": {"unit": "requests", "avg": 60.0},
        "good_request_count": {"unit": "requests", "avg": 9.0},
        "error_request_count": {"unit": "requests", "avg": 51.0},
        "errors_by_kind": {"cancelled": 51},
    });
    let older = json!({
        "warmup_excluded": 64,
        "request_count": {"unit": "requests", "avg": 90.0},
        "good_request_count": {"unit": "requests", "avg": 37.0},
        "error_request_count": {"unit": "requests", "avg": 0.0},
        "cancelled_request_count": {"unit": "requests", "avg": 53.0},
        "errors_by_kind": {},
    });
    let cmp = compare_values(&oldest, &older);
    assert_eq!(row(&cmp, "requests completed"), (Some(9.0), Some(37.0)));
    assert_eq!(row(&cmp, "requests failed"), (Some(0.0), Some(0.0)));
    assert_eq!(
        row(&cmp, "requests cancelled at end"),
        (Some(51.0), Some(53.0))
    );
    assert_eq!(cmp.notes.len(), 2, "{:?}", cmp.notes);
    assert!(cmp.notes[0].starts_with("A is an older loadgen summary"));
    assert!(cmp.notes[0].contains("errors_by_kind.cancelled"));
    assert!(cmp.notes[1].starts_with("B is an older loadgen summary"));
    let table = render(&cmp, "a.json", "b.json");
    assert!(
        table.lines().any(|l| l.starts_with("note: A is")),
        "{table}"
    );
}

#[test]
fn compare_takes_aiperf_request_counts_as_they_are() {
    // AIPerf's export: request_count is the valid requests already; no warmup_excluded.
    let aiperf = json!({
        "request_count": {"unit": "requests", "avg": 200.0},
        "good_request_count": {"unit": "requests", "avg": 150.0},
    });
    let cmp = compare_values(&aiperf, &aiperf);
    assert_eq!(row(&cmp, "requests completed"), (Some(200.0), Some(200.0)));
    assert!(cmp.notes.is_empty());
}

/// A version-3 loadgen summary of `completed` requests.
fn measured(completed: f64, ttft_p90: f64, tokens_per_s: f64) -> serde_json::Value {
    let mut v = json!({
        "loadgen_summary_version": 3,
        "warmup_excluded": 64,
        "output_token_throughput": {"unit": "tokens/sec", "avg": tokens_per_s},
        "request_throughput": {"unit": "requests/sec", "avg": completed / 100.0},
        "request_count": {"unit": "requests", "avg": completed},
        "error_request_count": {"unit": "requests", "avg": 0.0},
        "cancelled_request_count": {"unit": "requests", "avg": 3.0},
    });
    if completed > 0.0 {
        v["time_to_first_token"] = json!({"unit": "ms", "avg": 100.0, "p90": ttft_p90});
    }
    v
}

#[test]
fn compare_warns_when_a_side_completed_fewer_than_30_requests() {
    let cmp = compare_values(&measured(8.0, 200.0, 900.0), &measured(10.0, 150.0, 1000.0));
    assert_eq!(cmp.warnings.len(), 2, "{:?}", cmp.warnings);
    assert!(cmp.warnings[0].starts_with("A completed only 8 measured requests (fewer than 30)"));
    assert!(cmp.warnings[1].starts_with("B completed only 10 measured requests"));
    let table = render(&cmp, "a.json", "b.json");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("warning: A completed only 8")),
        "{table}"
    );
    // The changes are still shown; the warning qualifies them.
    assert!(table.contains("-25.0%"), "{table}");

    let cmp = compare_values(&measured(40.0, 200.0, 900.0), &measured(8.0, 150.0, 1000.0));
    assert_eq!(cmp.warnings.len(), 1, "{:?}", cmp.warnings);
    assert!(cmp.warnings[0].starts_with("B completed only 8"));
}

#[test]
fn compare_does_not_warn_when_both_sides_completed_30_or_more() {
    let cmp = compare_values(
        &measured(30.0, 200.0, 900.0),
        &measured(500.0, 150.0, 1000.0),
    );
    assert!(cmp.warnings.is_empty(), "{:?}", cmp.warnings);
    let table = render(&cmp, "a.json", "b.json");
    assert!(!table.contains("warning"), "{table}");
}

#[test]
fn compare_says_a_side_measured_nothing_instead_of_showing_zeros_as_changes() {
    let cmp = compare_values(&measured(40.0, 200.0, 900.0), &measured(0.0, 0.0, 0.0));
    assert_eq!(cmp.warnings.len(), 1, "{:?}", cmp.warnings);
    assert!(
        cmp.warnings[0].starts_with("B completed no measured request"),
        "{:?}",
        cmp.warnings
    );
    // B's throughputs are 0 only because it measured nothing: absent, not a -100 % change.
    let tokens = cmp
        .rows
        .iter()
        .find(|r| r.metric == "output tokens/s")
        .expect("row");
    assert_eq!(
        (tokens.a, tokens.b, tokens.delta, tokens.delta_pct),
        (Some(900.0), None, None, None)
    );
    assert_eq!(row(&cmp, "TTFT p90 (ms)"), (Some(200.0), None));
    // The counts are counts: B really completed 0 and cancelled 3.
    assert_eq!(row(&cmp, "requests completed"), (Some(40.0), Some(0.0)));
    assert_eq!(
        row(&cmp, "requests cancelled at end"),
        (Some(3.0), Some(3.0))
    );
    let table = render(&cmp, "a.json", "b.json");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("output tokens/s") && !l.contains('%')),
        "{table}"
    );

    // Two empty summaries: both said, and no throughput row of zeros against zeros.
    let empty = measured(0.0, 0.0, 0.0);
    let cmp = compare_values(&empty, &empty);
    assert_eq!(cmp.warnings.len(), 2, "{:?}", cmp.warnings);
    assert!(
        cmp.rows.iter().all(|r| r.metric.starts_with("requests ")),
        "{:?}",
        cmp.rows
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

/// JSON that holds none of the compared metrics (an empty object, an array, a step grid) is
/// refused by name, not shown as a table of dashes.
#[test]
fn compare_refuses_json_that_is_not_a_summary() {
    let dir = std::env::temp_dir().join(format!("loadgen-compare-ns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("good.json");
    std::fs::write(&good, summary(100.0, 50.0, None).to_string()).expect("write");
    for (name, text) in [
        ("empty.json", "{}"),
        ("array.json", "[1, 2]"),
        ("grid.json", r#"{"shape": "llama-8b", "steps": []}"#),
    ] {
        let other = dir.join(name);
        std::fs::write(&other, text).expect("write");
        let err = loadgen::compare::compare_files(&good, &other).expect_err(name);
        assert!(
            err.to_string().contains(name) && err.to_string().contains("not a loadgen"),
            "{err}"
        );
    }
    assert!(loadgen::compare::compare_files(&good, &good).is_ok());
}

#[test]
fn compare_warns_when_a_side_gives_its_latencies_in_another_unit() {
    let a = summary(100.0, 50.0, None);
    let mut b = a.clone();
    b["time_to_first_token"]["unit"] = json!("s");
    let cmp = compare_values(&a, &b);
    assert!(
        cmp.warnings
            .iter()
            .any(|w| w.contains("B's time_to_first_token is in s")),
        "{:?}",
        cmp.warnings
    );
    assert!(compare_values(&a, &a)
        .warnings
        .iter()
        .all(|w| !w.contains(" is in ")));
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
    assert_eq!(summary["loadgen_summary_version"], 3);
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

    let cmp_json = dir.join("compare.json");
    let compare = Command::new(exe)
        .arg("compare")
        .arg(&a_json)
        .arg(&a_json)
        .arg("--json")
        .arg(&cmp_json)
        .output()
        .expect("compare");
    assert!(compare.status.success());
    let text = String::from_utf8_lossy(&compare.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("TTFT p90 (ms)") && l.contains("+0.0%")),
        "{text}"
    );
    // The JSON holds what the table shows: its rows and the warnings printed above it.
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cmp_json).unwrap()).unwrap();
    let ttft = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == "TTFT p90 (ms)")
        .expect("a TTFT p90 row");
    assert_eq!(ttft["delta"], 0.0);
    let warned = text.lines().filter(|l| l.starts_with("warning: ")).count();
    assert!(warned > 0, "6 requests a side: {text}");
    assert_eq!(doc["warnings"].as_array().unwrap().len(), warned, "{text}");
    assert_eq!(doc["a"], a_json.display().to_string());
}

/// Values that could only end in an allocation failure or a failed first request are refused
/// at once, naming the flag.
#[test]
fn the_binary_refuses_oversized_loads_and_https_before_contacting_anything() {
    let exe = env!("CARGO_BIN_EXE_loadgen");
    for (args, says) in [
        (
            &[
                "--synthetic",
                "--concurrency",
                "2",
                "--synthetic-sessions",
                "4294967295",
            ][..],
            "--synthetic-sessions must be 1 to 100000",
        ),
        (
            &["--fixed", "10,10", "--concurrency", "99999999"],
            "--concurrency must be at most 100000",
        ),
        (
            &["--fixed", "10,10", "--concurrency", "1", "--duration", "0s"],
            "--duration must be above 0",
        ),
        (
            &[
                "--fixed",
                "10,10",
                "--concurrency",
                "1",
                "--request-timeout",
                "0s",
            ],
            "--request-timeout must be above 0",
        ),
        (
            &[
                "--fixed",
                "10,10",
                "--concurrency",
                "1",
                "--max-requests",
                "0",
            ],
            "--max-requests must be at least 1",
        ),
    ] {
        let out = Command::new(exe)
            .args(["--url", "http://127.0.0.1:9", "--no-progress"])
            .args(args)
            .output()
            .expect("run loadgen");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    let out = Command::new(exe)
        .args([
            "--url",
            "https://127.0.0.1:9",
            "--fixed",
            "10,10",
            "--concurrency",
            "1",
        ])
        .output()
        .expect("run loadgen");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("https is not supported"),
        "{err}"
    );
}

//! `--request-rate`: open-loop Poisson arrivals that follow the seed, never wait for the
//! server, respect an in-flight cap the way AIPerf does, and stop by themselves.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::cli::{args, loadgen};
use common::Behavior;
use loadgen::poisson::{PoissonArrivals, PoissonSource, Shapes};
use loadgen::record::ErrorKind;
use loadgen::runner::{run, RunOutput};
use loadgen::summary::StopReason;

fn fixed_source(rate: f64, cap: Option<usize>, seed: u64) -> PoissonSource {
    let arrivals = PoissonArrivals::new(rate, seed).expect("rate");
    let shapes = Shapes::Fixed {
        input: 8,
        output: 2,
    };
    PoissonSource::new(arrivals, shapes, cap, seed).expect("source")
}

/// The send times (run seconds) the source scheduled, in send order.
fn schedule(out: &RunOutput) -> Vec<f64> {
    let mut by_id: Vec<(u64, f64)> = out.records.iter().map(|r| (r.id, r.scheduled_s)).collect();
    by_id.sort_by_key(|(id, _)| *id);
    by_id.into_iter().map(|(_, t)| t).collect()
}

#[tokio::test]
async fn the_same_seed_sends_on_the_same_schedule_and_that_schedule_is_the_seeds_draws() {
    let mock = common::start(|_| Behavior::stream(2, 1), None).await;
    let cfg = common::config(&mock.url(), Duration::from_secs(60), Some(20));
    let mut runs = Vec::new();
    for seed in [9, 9, 10] {
        let mut source = fixed_source(200.0, None, seed);
        let out = run(&mut source, &cfg).await.expect("run");
        assert_eq!(out.stop_reason, StopReason::MaxRequests);
        assert_eq!(out.records.len(), 20);
        runs.push(schedule(&out));
    }
    assert_eq!(runs[0], runs[1], "same seed, same send times");
    assert_ne!(runs[0], runs[2], "another seed, other send times");
    // Arrival k is the sum of the seed's first k + 1 inter-arrival draws.
    let a = PoissonArrivals::new(200.0, 9).expect("rate");
    let mut t = 0.0;
    for (k, sent) in runs[0].iter().enumerate() {
        t += a.interval(k as u64);
        assert!((sent - t).abs() < 1e-9, "arrival {k}: {sent} vs {t}");
    }
}

#[tokio::test]
async fn sends_do_not_wait_for_responses_even_from_a_server_that_never_answers() {
    let mock = common::start(|_| Behavior::Hang, None).await;
    let arrivals = PoissonArrivals::new(100.0, 4).expect("rate");
    let last = (0..10).map(|k| arrivals.interval(k)).sum::<f64>();
    assert!(
        last < 1.0,
        "precondition: the seed's 10 arrivals fall in the first second"
    );
    let mut cfg = common::config(&mock.url(), Duration::from_secs(3), Some(10));
    cfg.grace = Duration::from_millis(100);
    let mut source = fixed_source(100.0, None, 4);
    let out = run(&mut source, &cfg).await.expect("run");
    // A closed loop would have sent one request per lane and then waited forever.
    assert_eq!(mock.seen().len(), 10, "every arrival reached the server");
    assert_eq!(out.stop_reason, StopReason::MaxRequests);
    assert_eq!(out.records.len(), 10);
    assert!(out.records.iter().all(|r| r
        .error
        .as_ref()
        .is_some_and(|e| e.kind == ErrorKind::Cancelled)));
    assert_eq!(out.skipped_arrivals, 0);
}

#[tokio::test]
async fn a_concurrency_cap_skips_arrivals_that_find_it_full_instead_of_queueing_them() {
    let mock = common::start(|_| Behavior::Hang, None).await;
    let mut cfg = common::config(&mock.url(), Duration::from_millis(500), None);
    cfg.grace = Duration::from_millis(100);
    let mut source = fixed_source(200.0, Some(3), 2);
    let out = run(&mut source, &cfg).await.expect("run");
    assert_eq!(out.stop_reason, StopReason::Duration);
    assert_eq!(mock.seen().len(), 3, "never more than the cap in flight");
    assert_eq!(out.records.len(), 3);
    assert!(
        out.skipped_arrivals > 0,
        "the arrivals while the cap was full were dropped"
    );
}

#[tokio::test]
async fn a_rate_run_stops_at_its_request_count_or_its_duration() {
    let mock = common::start(|_| Behavior::stream(1, 1), None).await;
    let by_count = common::config(&mock.url(), Duration::from_secs(60), Some(25));
    let out = run(&mut fixed_source(300.0, None, 1), &by_count)
        .await
        .expect("run");
    assert_eq!(out.stop_reason, StopReason::MaxRequests);
    assert_eq!(out.records.len(), 25);
    assert!(out.records.iter().all(|r| r.ok()));

    let by_time = common::config(&mock.url(), Duration::from_millis(300), None);
    let out = run(&mut fixed_source(100.0, None, 1), &by_time)
        .await
        .expect("run");
    assert_eq!(out.stop_reason, StopReason::Duration);
    assert!(!out.records.is_empty());
    assert!(out.records.iter().all(|r| r.scheduled_s <= 0.3));
}

fn temp_json(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loadgen-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_records_the_rate_and_the_cap_of_fixed_and_synthetic_rate_runs() {
    let mock = common::start(|_| Behavior::stream(1, 1), None).await;
    for (source, cap) in [
        (&["--fixed", "8,2"][..], None),
        (&["--fixed", "8,2"][..], Some("4")),
        (&["--synthetic", "--synthetic-sessions", "4"][..], None),
    ] {
        let json = temp_json(&format!(
            "{}-{cap:?}.json",
            source[0].trim_start_matches('-')
        ));
        let mut a = args(&[
            "--url",
            &mock.url(),
            "--request-rate",
            "200",
            "--no-progress",
        ]);
        a.extend(args(&["--max-requests", "15", "--json"]));
        a.push(json.display().to_string());
        a.extend(args(source));
        if let Some(c) = cap {
            a.extend(args(&["--concurrency", c]));
        }
        let out = loadgen(a).await;
        assert!(
            out.status.success(),
            "{source:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("summary")).expect("JSON");
        assert_eq!(s["run"]["request_rate"], 200.0, "{source:?}");
        assert_eq!(s["stop_reason"], "max_requests", "{source:?}");
        assert_eq!(s["request_count"]["avg"], 15.0, "{source:?}");
        assert_eq!(
            s["warmup_excluded"], 0,
            "{source:?}: open loop has no warm-up"
        );
        match cap {
            Some(c) => assert_eq!(s["run"]["concurrency"], c.parse::<u64>().expect("cap")),
            None => assert!(s["run"]["concurrency"].is_null(), "{source:?}"),
        }
        assert!(s["run"]["source"]
            .as_str()
            .is_some_and(|d| d.contains("Poisson")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_that_is_not_positive_and_finite_or_a_trace_source_is_refused() {
    let url = "http://127.0.0.1:9";
    for bad in ["0", "-2", "nan", "inf"] {
        let rate = format!("--request-rate={bad}");
        let out = loadgen(args(&[
            "--url",
            url,
            "--fixed",
            "8,2",
            &rate,
            "--no-progress",
        ]))
        .await;
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--request-rate"), "{bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mooncake.jsonl");
    let out = loadgen(args(&[
        "--url",
        url,
        "--request-rate",
        "5",
        "--no-progress",
        "--mooncake",
        &trace.display().to_string(),
    ]))
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rate-scale"), "{err}");
}

//! The run loop obeys the closed-loop rule, always stops by itself, and survives failures.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Behavior;
use loadgen::runner::run;
use loadgen::source::FixedLanes;
use loadgen::summary::{RunInfo, StopReason, Summary};

fn info() -> RunInfo {
    RunInfo {
        url: "mock".into(),
        endpoint: "completions".into(),
        model: "mock".into(),
        source: "fixed lanes".into(),
        concurrency: None,
        rate_scale: 1.0,
        seed: 0,
        duration_limit_s: 0.0,
        max_requests: None,
        send_jitter_ms: 0.0,
        request_rate: None,
    }
}

#[tokio::test]
async fn a_lanes_next_request_is_never_sent_before_previous_end_plus_gap() {
    let mock = common::start(|_| Behavior::stream(20, 5), None).await;
    let gap = 0.15;
    let mut source = FixedLanes::new(3, 16, 4, gap, false);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(12)),
    )
    .await
    .expect("run");
    assert_eq!(out.stop_reason, StopReason::MaxRequests);
    assert_eq!(out.records.len(), 12);
    let mut by_lane: BTreeMap<usize, Vec<_>> = BTreeMap::new();
    for r in &out.records {
        by_lane
            .entry(r.lane.expect("closed loop has lanes"))
            .or_default()
            .push(r);
    }
    assert_eq!(by_lane.len(), 3);
    for (lane, mut rs) in by_lane {
        rs.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        for w in rs.windows(2) {
            assert!(
                w[1].start_s >= w[0].end_s + gap - 1e-3,
                "lane {lane}: sent at {} before end {} + gap {gap}",
                w[1].start_s,
                w[0].end_s
            );
            assert!(w[1].scheduled_s >= w[0].end_s + gap - 1e-3);
        }
    }
    // Never more than one request per lane in flight.
    assert!(mock.seen().len() == 12);
}

#[tokio::test]
async fn the_run_stops_after_max_requests_measured_requests() {
    let mock = common::start(|_| Behavior::stream(0, 1), None).await;
    let mut source = FixedLanes::new(4, 8, 2, 0.0, true);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(10)),
    )
    .await
    .expect("run");
    assert_eq!(out.stop_reason, StopReason::MaxRequests);
    let measured = out.records.iter().filter(|r| !r.warmup).count();
    let warmups = out.records.iter().filter(|r| r.warmup).count();
    assert_eq!(measured, 10);
    assert_eq!(
        warmups, 4,
        "one warm-up per lane, not counted against the limit"
    );
    let s = Summary::from_records(&out.records, out.stop_reason, out.wall_time_s, None, info());
    assert_eq!(s.request_count.avg, 10.0);
    assert_eq!(s.warmup_excluded, 4);
}

#[tokio::test]
async fn the_run_stops_after_its_duration_and_cancels_what_is_still_in_flight() {
    let mock = common::start(|_| Behavior::Hang, None).await;
    let mut source = FixedLanes::new(3, 8, 2, 0.0, false);
    let started = Instant::now();
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_millis(300), None),
    )
    .await
    .expect("run");
    // Generous: 300 ms + 300 ms grace, on a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(out.stop_reason, StopReason::Duration);
    assert_eq!(out.records.len(), 3);
    let s = Summary::from_records(&out.records, out.stop_reason, out.wall_time_s, None, info());
    // Cancelled by the run's end: counted apart, not as errors.
    assert_eq!(s.cancelled_request_count.avg, 3.0);
    assert_eq!(s.error_request_count.avg, 0.0);
    assert!(s.errors_by_kind.is_empty());
    assert!(s.was_cancelled);
}

#[tokio::test]
async fn server_errors_and_dropped_streams_are_counted_and_the_run_goes_on() {
    // Every third request fails with 500, every third-plus-one drops mid-stream.
    let mock = common::start(
        |n| match n % 3 {
            0 => Behavior::Status(500),
            1 => Behavior::DropAfter(1),
            _ => Behavior::stream(0, 1),
        },
        None,
    )
    .await;
    let mut source = FixedLanes::new(2, 8, 3, 0.0, false);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(30)),
    )
    .await
    .expect("run");
    let s = Summary::from_records(&out.records, out.stop_reason, out.wall_time_s, None, info());
    assert_eq!(s.request_count.avg, 10.0, "completed requests only");
    assert_eq!(s.error_request_count.avg, 20.0);
    assert_eq!(s.errors_by_kind.get("http_500"), Some(&10));
    assert_eq!(s.errors_by_kind.get("dropped_stream"), Some(&10));
    let ttft = s
        .time_to_first_token
        .expect("successful requests have TTFTs");
    assert!(ttft.avg >= 0.0);
}

#[tokio::test]
async fn an_unreachable_server_is_counted_not_fatal() {
    let url = common::closed_port_url().await;
    let mut source = FixedLanes::new(2, 8, 2, 0.01, false);
    let out = run(
        &mut source,
        &common::config(&url, Duration::from_secs(60), Some(6)),
    )
    .await
    .expect("run");
    let s = Summary::from_records(&out.records, out.stop_reason, out.wall_time_s, None, info());
    assert_eq!(s.errors_by_kind.get("connect"), Some(&6));
    assert!(
        out.records.iter().all(|r| r
            .error
            .as_ref()
            .is_some_and(|e| e.message == "connection refused")),
        "{:?}",
        out.records[0].error
    );
    assert!(s.time_to_first_token.is_none());
}

#[tokio::test]
async fn genslot_counters_are_scraped_before_and_after_the_run() {
    // Every request served adds one pause and one forced resume.
    let metrics: Arc<dyn Fn(u64) -> String + Send + Sync> = Arc::new(|n| {
        format!(
            "# TYPE genslot_pauses_total counter\ngenslot_pauses_total {}\n\
             genslot_resumes_total{{forced=\"true\"}} {}\ngenslot_resumes_total{{forced=\"false\"}} 2\n",
            n + 5,
            n
        )
    });
    let mock = common::start(|_| Behavior::stream(0, 1), Some(metrics)).await;
    let mut source = FixedLanes::new(2, 8, 2, 0.0, false);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(8)),
    )
    .await
    .expect("run");
    let m = out
        .server_metrics
        .expect("the mock exposes genslot counters");
    assert_eq!(m.pauses, 8.0);
    assert_eq!(m.resumes_forced, 8.0);
    assert_eq!(m.resumes_normal, 0.0);
}

#[tokio::test]
async fn a_server_without_genslot_metrics_gives_no_server_block() {
    let mock = common::start(|_| Behavior::stream(0, 1), None).await;
    let mut source = FixedLanes::new(1, 8, 2, 0.0, false);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(2)),
    )
    .await
    .expect("run");
    assert!(out.server_metrics.is_none());
}

#[tokio::test]
async fn the_scheduled_send_time_goes_out_as_x_arrival_time_only_when_asked() {
    let mock = common::start(|_| Behavior::stream(0, 1), None).await;
    let mut source = FixedLanes::new(1, 8, 2, 0.0, false);
    let mut cfg = common::config(&mock.url(), Duration::from_secs(60), Some(2));
    run(&mut source, &cfg).await.expect("run");
    assert!(mock.seen().iter().all(|s| s.arrival_header.is_none()));

    cfg.send_arrival_time = true;
    let mut source = FixedLanes::new(1, 8, 2, 0.0, false);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    run(&mut source, &cfg).await.expect("run");
    let sent: Vec<f64> = mock
        .seen()
        .iter()
        .filter_map(|s| {
            s.arrival_header
                .as_deref()
                .map(|h| h.parse::<f64>().expect("unix seconds"))
        })
        .collect();
    assert_eq!(sent.len(), 2);
    // Unix seconds of this run (generous bounds: the clock is only read, not timed).
    assert!(
        sent.iter()
            .all(|t| *t >= before - 1.0 && *t < before + 600.0),
        "{sent:?}"
    );
}

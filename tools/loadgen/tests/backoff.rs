//! A closed-loop lane backs off when its server is not there or refuses it for now, instead
//! of sending its next request the instant a connection is refused.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Behavior;
use loadgen::app::nothing_completed;
use loadgen::backoff::FLOOR;
use loadgen::record::{ErrorKind, RequestRecord};
use loadgen::runner::run;
use loadgen::source::FixedLanes;
use loadgen::summary::{RunInfo, Summary};

fn info(url: &str) -> RunInfo {
    RunInfo {
        url: url.into(),
        endpoint: "completions".into(),
        model: "mock".into(),
        source: "fixed lanes".into(),
        concurrency: Some(4),
        rate_scale: 1.0,
        seed: 0,
        duration_limit_s: 1.0,
        max_requests: None,
        send_jitter_ms: 0.0,
        request_rate: None,
    }
}

/// Each lane's records in send order.
fn by_lane(records: &[RequestRecord]) -> BTreeMap<usize, Vec<&RequestRecord>> {
    let mut lanes: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        lanes
            .entry(r.lane.expect("closed loop has lanes"))
            .or_default()
            .push(r);
    }
    for rs in lanes.values_mut() {
        rs.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    }
    lanes
}

#[tokio::test]
async fn lanes_facing_a_refused_connection_back_off_instead_of_hammering_the_port() {
    let url = common::closed_port_url().await;
    let lanes = 4;
    let duration = Duration::from_secs(1);
    let mut source = FixedLanes::new(lanes, 8, 4, 0.0, false);
    let out = run(&mut source, &common::config(&url, duration, None))
        .await
        .expect("run");
    assert!(out.records.len() >= lanes, "every lane tried");
    assert!(out.records.iter().all(|r| r
        .error
        .as_ref()
        .is_some_and(|e| e.kind == ErrorKind::Connect)));
    // No lane sends again sooner than half the first back-off after a refusal, so a lane
    // makes at most 1 + duration / (FLOOR / 2) attempts (back to back it made thousands).
    let min_wait = FLOOR.as_secs_f64() / 2.0;
    let bound = lanes * (2 + (duration.as_secs_f64() / min_wait) as usize);
    assert!(
        out.records.len() <= bound,
        "{} attempts in {duration:?} from {lanes} lanes (bound {bound})",
        out.records.len()
    );
    for (lane, rs) in by_lane(&out.records) {
        for w in rs.windows(2) {
            assert!(
                w[1].start_s >= w[0].end_s + min_wait - 1e-3,
                "lane {lane}: sent at {} after a refusal at {}",
                w[1].start_s,
                w[0].end_s
            );
        }
    }
    // Every attempt is a failed measured request, and the run says why nothing completed.
    let summary = Summary::from_records(
        &out.records,
        out.stop_reason,
        out.wall_time_s,
        None,
        info(&url),
    );
    assert_eq!(summary.error_request_count.avg, out.records.len() as f64);
    assert_eq!(
        summary.errors_by_kind.get("connect").copied(),
        Some(out.records.len() as u64)
    );
    let why = nothing_completed(&summary, &out.records, &url);
    assert!(
        why.contains(&format!(
            "cannot reach the server at {url}: connection refused"
        )),
        "{why}"
    );
    assert!(why.contains("could connect"), "{why}");
}

#[tokio::test]
async fn a_429_with_retry_after_delays_the_lanes_next_send_and_a_5xx_without_it_backs_off() {
    let mock = common::start(
        |n| match n {
            0 => Behavior::StatusRetryAfter(429, 1),
            1 => Behavior::Status(503),
            2 => Behavior::Status(502),
            _ => Behavior::stream(0, 0),
        },
        None,
    )
    .await;
    let mut source = FixedLanes::new(1, 8, 4, 0.0, false);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(4)),
    )
    .await
    .expect("run");
    let lane = by_lane(&out.records).remove(&0).expect("lane 0");
    assert_eq!(lane.len(), 4);
    let throttled = lane[0].error.as_ref().expect("429");
    assert_eq!(throttled.key(), "http_429");
    assert_eq!(throttled.retry_after_s, Some(1.0));
    assert!(
        lane[1].start_s >= lane[0].end_s + 1.0 - 1e-3,
        "sent {} s after the 429 that asked for 1 s",
        lane[1].start_s - lane[0].end_s
    );
    assert_eq!(
        lane[1].error.as_ref().map(|e| e.key()).as_deref(),
        Some("http_503")
    );
    assert!(
        lane[2].start_s >= lane[1].end_s + FLOOR.as_secs_f64() / 2.0 - 1e-3,
        "sent {} s after a 503",
        lane[2].start_s - lane[1].end_s
    );
    // A gateway's 502 right after: the second failure in a row waits at least FLOOR.
    assert_eq!(
        lane[2].error.as_ref().map(|e| e.key()).as_deref(),
        Some("http_502")
    );
    assert!(
        lane[3].start_s >= lane[2].end_s + FLOOR.as_secs_f64() - 1e-3,
        "sent {} s after a 502",
        lane[3].start_s - lane[2].end_s
    );
    assert!(lane[3].ok());
}

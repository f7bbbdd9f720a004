//! Closed-loop lanes wait a seeded jitter between a completion and their next send, so they
//! do not phase-lock to a server's decode loop; with no jitter they send back to back.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::Behavior;
use genslot::workload::{OpenLoopReplay, OpenLoopRules, TimedRequest};
use loadgen::jitter::SendJitter;
use loadgen::record::RequestRecord;
use loadgen::replay::ReplaySource;
use loadgen::runner::{run, RunConfig};
use loadgen::source::FixedLanes;

const LANES: usize = 4;
const REQUESTS: u64 = 24;
/// Waits compared per lane. Lanes with long waits fall behind, so they do not all get the
/// same number of sends; a response (~160 ms) longer than any wait keeps every lane past this.
const COMPARED: usize = 3;

fn jittered(url: &str, max: Duration, seed: u64) -> RunConfig {
    RunConfig {
        send_jitter: max,
        jitter_seed: seed,
        ..common::config(url, Duration::from_secs(60), Some(REQUESTS))
    }
}

/// Per lane, in send order: how long after the previous request's end each of its first
/// [`COMPARED`] follow-up requests was scheduled.
fn offsets_by_lane(records: &[RequestRecord]) -> BTreeMap<usize, Vec<f64>> {
    let mut by_lane: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        by_lane
            .entry(r.lane.expect("closed loop has lanes"))
            .or_default()
            .push(r);
    }
    by_lane
        .into_iter()
        .map(|(lane, mut rs)| {
            rs.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
            for r in &rs {
                assert!(r.ok(), "lane {lane}: {:?}", r.error);
                assert!(
                    r.start_s >= r.scheduled_s - 1e-3,
                    "lane {lane}: sent at {} before its schedule {}",
                    r.start_s,
                    r.scheduled_s
                );
            }
            let offsets: Vec<f64> = rs
                .windows(2)
                .map(|w| w[1].scheduled_s - w[0].end_s)
                .take(COMPARED)
                .collect();
            assert_eq!(offsets.len(), COMPARED, "lane {lane} sent too few requests");
            (lane, offsets)
        })
        .collect()
}

async fn lane_offsets(max: Duration, seed: u64) -> BTreeMap<usize, Vec<f64>> {
    let mock = common::start(|_| Behavior::stream(100, 20), None).await;
    let mut source = FixedLanes::new(LANES, 8, 4, 0.0, false);
    let out = run(&mut source, &jittered(&mock.url(), max, seed))
        .await
        .expect("run");
    assert_eq!(out.records.len(), REQUESTS as usize);
    offsets_by_lane(&out.records)
}

#[tokio::test]
async fn each_lanes_next_send_waits_the_jitter_its_seed_draws() {
    let max = Duration::from_millis(80);
    let offsets = lane_offsets(max, 7).await;
    assert_eq!(offsets.len(), LANES);
    let mut all = Vec::new();
    for (lane, got) in &offsets {
        for (n, off) in got.iter().enumerate() {
            let want = SendJitter::draw(max, 7, *lane, n as u64);
            assert!(
                (off - want).abs() < 1e-9,
                "lane {lane}, send {}: waited {off} s after the previous end, drew {want} s",
                n + 1
            );
            assert!((0.0..0.080).contains(off));
        }
        all.extend_from_slice(got);
    }
    // Desynchronised: the lanes' waits differ from one another and spread over the range.
    all.sort_by(f64::total_cmp);
    let spread = all[all.len() - 1] - all[0];
    assert!(spread > 0.040, "waits span only {spread} s of 0.080 s");
}

#[tokio::test]
async fn the_same_seed_gives_the_same_waits_and_another_seed_other_waits() {
    let max = Duration::from_millis(60);
    let a = lane_offsets(max, 11).await;
    let b = lane_offsets(max, 11).await;
    let c = lane_offsets(max, 12).await;
    let close = |x: &BTreeMap<usize, Vec<f64>>, y: &BTreeMap<usize, Vec<f64>>| {
        x.len() == y.len()
            && x.iter().zip(y).all(|((lx, vx), (ly, vy))| {
                lx == ly
                    && vx.len() == vy.len()
                    && vx.iter().zip(vy).all(|(p, q)| (p - q).abs() < 1e-9)
            })
    };
    assert!(close(&a, &b), "seed 11 twice: {a:?} vs {b:?}");
    assert!(!close(&a, &c), "seeds 11 and 12 drew the same waits");
}

#[tokio::test]
async fn without_jitter_a_lane_sends_the_moment_its_previous_response_ends() {
    let offsets = lane_offsets(Duration::ZERO, 7).await;
    for (lane, got) in offsets {
        assert!(
            got.iter().all(|off| *off == 0.0),
            "lane {lane} waited {got:?}"
        );
    }
}

#[tokio::test]
async fn open_loop_arrivals_keep_their_timestamps_with_jitter_on() {
    let mock = common::start(|_| Behavior::stream(0, 1), None).await;
    let requests: Vec<TimedRequest> = (0..4)
        .map(|i| TimedRequest {
            t: 0.05 * f64::from(i),
            input_tokens: 10,
            output_tokens: 2,
            hash_ids: Default::default(),
            block_size: 0,
        })
        .collect();
    let engine =
        OpenLoopReplay::new(Arc::from(requests), OpenLoopRules::default()).expect("engine");
    let mut source = ReplaySource::new(engine, true, 0);
    let cfg = RunConfig {
        send_jitter: Duration::from_millis(500),
        jitter_seed: 3,
        ..common::config(&mock.url(), Duration::from_secs(60), None)
    };
    let out = run(&mut source, &cfg).await.expect("run");
    let mut scheduled: Vec<f64> = out.records.iter().map(|r| r.scheduled_s).collect();
    scheduled.sort_by(f64::total_cmp);
    assert_eq!(scheduled.len(), 4);
    for (i, s) in scheduled.iter().enumerate() {
        assert!(
            (s - 0.05 * i as f64).abs() < 1e-9,
            "request {i} scheduled at {s}"
        );
    }
}

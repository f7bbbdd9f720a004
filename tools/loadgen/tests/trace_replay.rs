//! Trace-driven runs through `genslot::workload`'s replay engines: the AgentX closed-loop gap
//! rule on real wall-clock sends, and open-loop arrivals by timestamp.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::Behavior;
use genslot::workload::{
    load_trace, AgentxReplay, OpenLoopReplay, OpenLoopRules, ReplayRules, TimedRequest, Trace,
    TraceFormat,
};
use loadgen::replay::ReplaySource;
use loadgen::runner::run;
use loadgen::summary::StopReason;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Recorded end-to-start gap before the request with this many input tokens, under a cap.
/// The fixture's turns are t = 0, 1.1, 6.1, 7.2 with api_time 1.0 each.
fn expected_gap(input_tokens: u32, cap: f64) -> f64 {
    let raw = match input_tokens {
        200 => 0.1,
        300 => 4.0,
        400 => 0.1,
        _ => 0.0,
    };
    f64::min(raw, cap)
}

#[tokio::test]
async fn agentx_lanes_send_no_turn_before_the_previous_end_plus_its_capped_gap() {
    let mock = common::start(|_| Behavior::stream(10, 2), None).await;
    let Trace::Sessions(sessions) =
        load_trace(&fixture("gaps.json"), Some(TraceFormat::Weka)).expect("fixture")
    else {
        panic!("a Weka fixture gives sessions");
    };
    let cap = 0.3;
    let rules = ReplayRules {
        concurrency: 2,
        idle_cap_s: cap,
        ..ReplayRules::default()
    };
    let engine = AgentxReplay::new(Arc::from(sessions), rules, 7).expect("engine");
    let mut source = ReplaySource::new(engine, false, 0);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), Some(12)),
    )
    .await
    .expect("run");
    assert_eq!(out.stop_reason, StopReason::MaxRequests);

    // Consecutive turns of one replayed session tree, in send order.
    let mut by_conversation: BTreeMap<u64, Vec<_>> = BTreeMap::new();
    for r in &out.records {
        by_conversation
            .entry(r.conversation.expect("closed loop"))
            .or_default()
            .push(r);
    }
    let mut checked = 0;
    let mut capped = 0;
    for rs in by_conversation.values_mut() {
        rs.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        for w in rs.windows(2) {
            let gap = expected_gap(w[1].input_tokens, cap);
            assert!(
                w[1].start_s >= w[0].end_s + gap - 1e-3,
                "turn of {} tokens sent {:.3} s after the previous end, expected at least {gap}",
                w[1].input_tokens,
                w[1].start_s - w[0].end_s
            );
            checked += 1;
            capped += usize::from(w[1].input_tokens == 300);
        }
    }
    assert!(checked >= 4, "only {checked} consecutive turns checked");
    // The 4 s recorded gap was capped: the lane did not sit idle for it.
    assert!(capped >= 1);
    let lanes: std::collections::BTreeSet<_> = out.records.iter().filter_map(|r| r.lane).collect();
    assert!(lanes.len() <= 2);
    assert!(
        out.wall_time_s < 4.0 * 3.0,
        "4 s gaps were not capped: {} s",
        out.wall_time_s
    );
}

#[tokio::test]
async fn open_loop_requests_go_out_at_their_scaled_timestamps_without_waiting() {
    // The server is slow (3 s to first token); arrivals must not wait for completions.
    let mock = common::start(|_| Behavior::stream(3000, 1), None).await;
    let requests: Vec<TimedRequest> = (0..5)
        .map(|i| TimedRequest {
            t: 100.0 + 0.4 * f64::from(i),
            input_tokens: 10,
            output_tokens: 2,
            hash_ids: Default::default(),
            block_size: 0,
        })
        .collect();
    let rules = OpenLoopRules {
        scale: 2.0,
        ..OpenLoopRules::default()
    };
    let engine = OpenLoopReplay::new(Arc::from(requests), rules).expect("engine");
    let mut source = ReplaySource::new(engine, true, 0);
    let out = run(
        &mut source,
        &common::config(&mock.url(), Duration::from_secs(60), None),
    )
    .await
    .expect("run");
    assert_eq!(out.stop_reason, StopReason::SourceExhausted);
    let mut starts: Vec<f64> = out.records.iter().map(|r| r.start_s).collect();
    starts.sort_by(f64::total_cmp);
    assert_eq!(starts.len(), 5);
    for (i, s) in starts.iter().enumerate() {
        let due = 0.2 * i as f64; // 0.4 s apart, twice as fast
        assert!(*s >= due - 1e-3, "request {i} sent at {s} before {due}");
    }
    // All five were in flight together: the last was sent before the first finished.
    let first_end = out
        .records
        .iter()
        .map(|r| r.end_s)
        .fold(f64::INFINITY, f64::min);
    assert!(starts[4] < first_end, "open loop waited for a completion");
}

/// The shared Weka traces, next to the repository (`../shared/traces/weka_cc_agentic`).
fn real_weka_traces() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/weka_cc_agentic/weka_traces_runs.jsonl.gz");
    p.exists().then_some(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_replays_the_real_weka_traces_when_present() {
    let Some(path) = real_weka_traces() else {
        eprintln!("skipped: ../shared/traces/weka_cc_agentic is not next to this checkout");
        return;
    };
    let mock = common::start(|_| Behavior::stream(1, 0), None).await;
    let exe = env!("CARGO_BIN_EXE_loadgen");
    let url = mock.url();
    let dir = std::env::temp_dir().join(format!("loadgen-weka-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("weka.json");
    let records = dir.join("weka.jsonl");
    let (json_arg, records_arg) = (json.clone(), records.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(exe)
            .args([
                "--url",
                &url,
                "--concurrency",
                "4",
                "--max-requests",
                "12",
                "--idle-cap",
                "0s",
            ])
            .args(["--duration", "120s", "--no-progress", "--no-scrape"])
            .arg("--weka")
            .arg(&path)
            .arg("--json")
            .arg(&json_arg)
            .arg("--records")
            .arg(&records_arg)
            .output()
            .expect("run loadgen")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("summary")).expect("JSON");
    assert_eq!(s["request_count"]["avg"], 12.0);
    assert_eq!(s["error_request_count"]["avg"], 0.0);
    // What the server received has exactly the recorded input lengths, word for word.
    let recorded: u64 = std::fs::read_to_string(&records)
        .expect("records")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("record");
            v["metrics"]["input_sequence_length"]["value"]
                .as_u64()
                .expect("isl")
        })
        .sum();
    let received: u64 = mock
        .seen()
        .iter()
        .map(|r| {
            r.body["prompt"]
                .as_str()
                .map_or(0, |p| p.split_whitespace().count() as u64)
        })
        .sum();
    assert_eq!(received, recorded);
    assert!(
        recorded >= 12 * 1000,
        "Weka prompts are long; got {recorded} words in all"
    );
}

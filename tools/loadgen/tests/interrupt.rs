//! An interrupted run (Ctrl-C, SIGTERM) stops sending, cancels what is in flight without
//! waiting for the grace period, and still writes and prints what ran; the shell sees 130,
//! and `compare` warns that such a summary covers part of a run.

mod common;

use std::time::{Duration, Instant};

use common::cli::args;
use common::Behavior;
use loadgen::record::Outcome;
use loadgen::runner::{run_until, RunOutput};
use loadgen::source::FixedLanes;
use loadgen::summary::StopReason;

/// The first six requests stream a few tokens; every later one hangs, so two lanes end up
/// with one request each in flight that only a cancellation ends.
fn six_then_hang(i: u64) -> Behavior {
    if i < 6 {
        Behavior::stream(5, 2)
    } else {
        Behavior::Hang
    }
}

/// Two fixed lanes against `url` for `duration`, with a minute of grace, interrupted after
/// `interrupt_ms`: the run must end well before the grace would have.
async fn interrupted(url: &str, duration: Duration, interrupt_ms: u64) -> RunOutput {
    let mut source = FixedLanes::new(2, 8, 4, 0.0, false);
    let mut cfg = common::config(url, duration, None);
    cfg.grace = Duration::from_secs(60);
    let started = Instant::now();
    let interrupt = tokio::time::sleep(Duration::from_millis(interrupt_ms));
    let out = run_until(&mut source, &cfg, interrupt).await.expect("run");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the run waited {:?} after the interrupt",
        started.elapsed()
    );
    out
}

#[tokio::test]
async fn an_interrupt_stops_the_sends_and_cancels_what_is_in_flight_without_the_grace() {
    let mock = common::start(six_then_hang, None).await;
    let out = interrupted(&mock.url(), Duration::from_secs(60), 800).await;
    assert_eq!(out.stop_reason, StopReason::Interrupted);
    let count = |o: Outcome| out.records.iter().filter(|r| r.outcome() == o).count();
    assert_eq!(count(Outcome::Completed), 6);
    assert_eq!(count(Outcome::Cancelled), 2, "the two hanging requests");
    assert_eq!(out.abandoned, 0);
    assert_eq!(mock.seen().len(), 8, "nothing is sent after the interrupt");
}

#[tokio::test]
async fn an_interrupt_in_the_grace_period_keeps_the_runs_stop_reason() {
    let mock = common::start(|_| Behavior::Hang, None).await;
    let out = interrupted(&mock.url(), Duration::from_millis(200), 600).await;
    assert_eq!(
        out.stop_reason,
        StopReason::Duration,
        "the sends had stopped at the duration; the interrupt only cut the grace short"
    );
    assert_eq!(out.records.len(), 2);
    assert!(out
        .records
        .iter()
        .all(|r| r.outcome() == Outcome::Cancelled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_writes_what_ran_and_exits_130() {
    let mock = common::start(six_then_hang, None).await;
    let dir = tempfile::tempdir().unwrap();
    let (json, records) = (dir.path().join("run.json"), dir.path().join("run.jsonl"));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args(&[
            "--url",
            &mock.url(),
            "--fixed",
            "8,4",
            "--concurrency",
            "2",
            "--duration",
            "120s",
            "--grace",
            "120s",
            "--no-progress",
            "--json",
            json.to_str().unwrap(),
            "--records",
            records.to_str().unwrap(),
        ]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start loadgen");
    // Interrupt once both lanes hang on their request.
    let waiting = Instant::now();
    while mock.seen().len() < 8 {
        assert!(
            waiting.elapsed() < Duration::from_secs(30),
            "loadgen sent {} requests",
            mock.seen().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let interrupted = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    assert!(
        interrupted.elapsed() < Duration::from_secs(15),
        "exited {:?} after the interrupt",
        interrupted.elapsed()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("stopped by Interrupted"), "{table}");

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("summary written")).unwrap();
    assert_eq!(summary["stop_reason"], "interrupted");
    let lines = std::fs::read_to_string(&records).expect("records written");
    assert_eq!(
        lines.lines().count(),
        8,
        "every request sent has its record"
    );
    let completed = summary["request_count"]["avg"].as_f64().unwrap();
    let cancelled = summary["cancelled_request_count"]["avg"].as_f64().unwrap();
    let warmups = summary["warmup_excluded"].as_f64().unwrap();
    assert_eq!(completed + cancelled + warmups, 8.0, "{summary}");
    assert_eq!(cancelled, 2.0);

    // Compared, an interrupted side is named as partial.
    let cmp = common::cli::loadgen(args(&[
        "compare",
        json.to_str().unwrap(),
        json.to_str().unwrap(),
    ]))
    .await;
    let said =
        String::from_utf8_lossy(&cmp.stdout).to_string() + &String::from_utf8_lossy(&cmp.stderr);
    assert!(said.contains("A was interrupted"), "{said}");
    assert!(said.contains("B was interrupted"), "{said}");
}

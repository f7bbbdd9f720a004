//! A client that leaves while its request is paused in place is counted apart
//! (`genslot_requests_cancelled_while_paused_total`): what pausing cost beyond the TPOT it
//! adds. Requests that finish, paused on the way or not, are not counted. Its own test binary:
//! the metrics recorder is the process's.

mod serve_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use serde_json::{json, Value};
use serve_support::*;
use tokio::sync::oneshot;

const PREEMPT: &str = "max_batch_size: 4\n\
    scheduler_config:\n  gen_admission: { min_samples: 5, target_window: 50 }\n  \
    gen_preemption: { tpot_budget: 0.5 }\n";

/// Each streaming request's way to be cancelled, by its id (`cmpl-N` is engine id N).
type Cancels = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

/// One streamed completion: registers its cancel under its id once the first chunk names
/// it, then reads to the end unless cancelled (which drops the stream: the client is gone).
/// Returns whether it was cancelled.
async fn stream_one(s: &Server, prompt: String, max_tokens: u64, cancels: &Cancels) -> bool {
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let (tx, mut cancel) = oneshot::channel();
    let mut registered = Some(tx);
    let mut text = String::new();
    loop {
        tokio::select! {
            _ = &mut cancel => return true,
            chunk = body.next() => match chunk {
                None => return false,
                Some(c) => {
                    text.push_str(&String::from_utf8_lossy(&c.expect("a chunk")));
                    if let Some(tx) = registered.take_if(|_| text.contains("\"id\":\"cmpl-")) {
                        let id = text
                            .split("\"id\":\"cmpl-")
                            .nth(1)
                            .and_then(|t| t.split('"').next())
                            .and_then(|n| n.parse().ok())
                            .expect("a cmpl id");
                        cancels.lock().unwrap().insert(id, tx);
                    }
                }
            },
        }
    }
}

fn metric(text: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cancelled_while_paused_is_counted_and_finished_ones_are_not() {
    let s = Arc::new(Server::start(&config(PREEMPT)).await);
    let cancels: Cancels = Arc::default();
    let lanes: Vec<_> = (0..16)
        .map(|lane| {
            let (s, cancels) = (s.clone(), cancels.clone());
            tokio::spawn(async move {
                let mut cancelled = 0;
                for round in 0..6 {
                    let prompt = format!("lane {lane} round {round}");
                    let max_tokens = 100 + 10 * (lane % 11);
                    cancelled += u32::from(stream_one(&s, prompt, max_tokens, &cancels).await);
                }
                cancelled
            })
        })
        .collect();
    // Cancel requests the controller has paused, as their clients would leave, until one
    // departure is counted (a cancel can reach a request just after it resumed).
    let (mut sent, mut counted) = (0u64, 0u64);
    let start = Instant::now();
    while counted == 0 && start.elapsed() < WAIT {
        let d: Value = s.debug().await;
        let paused: Vec<u64> = d["worker"]["preemption"]["paused"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["id"].as_u64()).collect())
            .unwrap_or_default();
        for id in paused {
            if let Some(tx) = cancels.lock().unwrap().remove(&id) {
                sent += u64::from(tx.send(()).is_ok());
            }
        }
        let text = s.get("/metrics").await.text().await.unwrap();
        counted = metric(&text, "genslot_requests_cancelled_while_paused_total").unwrap_or(0);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let mut cancelled = 0;
    for lane in lanes {
        cancelled += tokio::time::timeout(WAIT * 3, lane).await.unwrap().unwrap();
    }
    assert!(cancelled > 0);
    let text = s.get("/metrics").await.text().await.unwrap();
    let counted = metric(&text, "genslot_requests_cancelled_while_paused_total").unwrap();
    let d = s.debug().await;
    let pauses = d["worker"]["preemption"]["totals"]["pauses"]
        .as_u64()
        .unwrap();
    assert!(pauses > 0, "no pause happened");
    // Only cancels are counted, and only those that found their request still paused: the
    // many requests that were paused and finished are not.
    assert!(
        counted >= 1,
        "{sent} cancels sent to paused requests, none counted"
    );
    assert!(counted <= sent, "{counted} counted of {sent} cancels");
    assert!(pauses > counted, "{pauses} pauses, {counted} counted");
}

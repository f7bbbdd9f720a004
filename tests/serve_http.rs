//! `genslot serve` end to end over loopback: the actor system with the timing-model backend
//! answers completions and chat, streaming and whole, and a client that goes away gives
//! every lease back.

mod serve_support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use serve_support::*;

#[tokio::test]
async fn completions_whole_and_streamed_return_every_token() {
    let s = Server::start(&config("")).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "the quick brown fox", "max_tokens": 7}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(v["usage"]["prompt_tokens"], 4);

    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "the quick brown fox", "max_tokens": 9, "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let c = chunks(&r.text().await.unwrap());
    let texts: String = c
        .iter()
        .filter_map(|c| c["choices"].get(0)?["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(texts.split_whitespace().count(), 9);
    assert_eq!(c.last().unwrap()["usage"]["completion_tokens"], 9);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn chat_whole_and_streamed_return_every_token() {
    let s = Server::start(&config("")).await;
    let msgs = json!([{"role": "user", "content": "hello there"}]);
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "max_completion_tokens": 5}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split_whitespace().count(), 5);

    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "max_tokens": 6, "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    let c = chunks(&r.text().await.unwrap());
    assert_eq!(c.last().unwrap()["usage"]["completion_tokens"], 6);
    assert_eq!(
        c.iter()
            .filter_map(|c| c["choices"].get(0)?["finish_reason"].as_str())
            .collect::<Vec<_>>(),
        vec!["length"]
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_gives_every_lease_back() {
    let s = Server::start(&config("")).await;
    let before = s.pools_used().await;
    assert!(before.iter().all(|(_, used)| *used == 0), "{before:?}");
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b c d e f g h", "max_tokens": 100000, "stream": true}),
        )
        .await;
    let mut body = r.bytes_stream();
    // Wait for decoding to start, then check the request holds leases.
    let mut got = 0;
    while got < 3 {
        let chunk = tokio::time::timeout(WAIT, body.next()).await.unwrap();
        got += chunk.is_some() as usize;
    }
    let during = s.pools_used().await;
    assert!(during.iter().all(|(_, used)| *used >= 1), "{during:?}");
    drop(body);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = s.pools_used().await;
        if now == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "leases not returned: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = s.debug().await;
    assert_eq!(d["executor"]["live_requests"], 0);
    assert_eq!(d["worker"]["totals"]["cancelled"], 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_that_cannot_fit_the_kv_cache_is_refused_not_queued_forever() {
    let s = Server::start(&config("kv_cache_config: { max_tokens: 640 }")).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b c", "max_tokens": 1000}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let ok = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b c", "max_tokens": 4}),
        )
        .await;
    assert_eq!(ok.status(), 200);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_fails_in_flight_requests_with_a_clear_reason() {
    let s = Server::start(&config("server: { drain_timeout_s: 0.2 }\n")).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 100000, "stream": true}),
        )
        .await;
    let mut body = r.bytes_stream();
    let first = tokio::time::timeout(WAIT, body.next()).await.unwrap();
    assert!(first.is_some());
    let stop = tokio::spawn(s.shutdown());
    let mut rest = String::new();
    while let Some(Ok(b)) = tokio::time::timeout(WAIT, body.next()).await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&b));
    }
    assert!(
        rest.contains(genslot::actors::SHUTDOWN_MESSAGE),
        "stream end: {rest}"
    );
    stop.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_full_queue_answers_429_and_loses_none_of_the_queued_requests() {
    let s = std::sync::Arc::new(
        Server::start(&config(
            "max_batch_size: 1\nscheduler_config: { gen_admission: { max_waiting: 2 } }\n",
        ))
        .await,
    );
    // The holder keeps the only slot until the test lets it go.
    let holder = s.slot_holder().await;
    assert_eq!(s.debug().await["worker"]["active"], 1);
    // Two more fill the queue.
    let body = json!({"prompt": "a b", "max_tokens": 60, "ignore_eos": true});
    let queued: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            let body = body.clone();
            tokio::spawn(async move { s.post("/v1/completions", &body).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.debug().await["worker"]["queue"]["len"] != 2 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let refused = s.post("/v1/completions", &body).await;
    assert_eq!(refused.status(), 429);
    // The holder goes away; both queued requests are then served whole.
    drop(holder);
    for r in queued {
        let r = r.await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 60);
    }
}

//! The actor engine behind the HTTP server, under clients that are not on our side: a forged
//! arrival stamp moves nothing, a request past `server.request_timeout_s` gives every lease
//! back, and what `/debug/actors` and `/metrics` show is current once the worker is idle.

mod serve_support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use serve_support::*;
use tokio::time::Instant;

async fn wait_for(what: &str, mut ready: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ready().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `name{labels} value` from a Prometheus text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// One slot held by a streaming request, ten waiters, then a request stamped `arrival_time:
/// 1.0` (1970); then the holder goes away. Returns when each waiter finished, when the forged
/// one did, and the server.
async fn forged_after_ten_waiters(policy: &str) -> (Vec<Instant>, Instant, std::sync::Arc<Server>) {
    let s = std::sync::Arc::new(
        Server::start(&config(&format!(
            "max_batch_size: 1\n\
             scheduler_config: {{ gen_admission: {{ policy: {policy}, target_window: 20, \
             min_samples: 1 }} }}\n"
        )))
        .await,
    );
    let post = |body: Value| {
        let s = s.clone();
        tokio::spawn(async move {
            let r = s.post("/v1/completions", &body).await;
            assert_eq!(r.status(), 200);
            let _: Value = r.json().await.unwrap();
            Instant::now()
        })
    };
    // The holder keeps the only slot until the test lets it go.
    let holder = s.slot_holder().await;
    let waiters: Vec<_> = (0..10)
        .map(|_| post(json!({"prompt": "b", "max_tokens": 2, "ignore_eos": true})))
        .collect();
    wait_for("ten waiters", async || {
        s.debug().await["worker"]["queue"]["len"] == 10
    })
    .await;
    let forged =
        post(json!({"prompt": "c", "max_tokens": 2, "ignore_eos": true, "arrival_time": 1.0}));
    wait_for("the forged request queued", async || {
        s.debug().await["worker"]["queue"]["len"] == 11
    })
    .await;
    drop(holder);
    let forged_done = forged.await.unwrap();
    let mut done = Vec::new();
    for w in waiters {
        done.push(w.await.unwrap());
    }
    (done, forged_done, s)
}

#[tokio::test]
async fn a_forged_arrival_time_does_not_jump_the_queue() {
    // First come, first served: only the arrival decides the order.
    let (waiters, forged, _s) = forged_after_ten_waiters("fcfs").await;
    assert!(
        waiters.iter().all(|w| *w <= forged),
        "a waiter that came first finished after the forged request"
    );
}

#[tokio::test]
async fn a_forged_arrival_time_does_not_move_x_or_the_ttft_histogram() {
    let (_, _, s) = forged_after_ten_waiters("auto").await;
    let x = s.debug().await["worker"]["queue"]["target_x_s"].as_f64();
    assert!(x.is_some_and(|x| x < 60.0), "X = {x:?}");
    let text = s.get("/metrics").await.text().await.unwrap();
    let ttft_sum = metric(&text, "genslot_time_to_first_token_seconds_sum").unwrap();
    assert!(ttft_sum < 1e4, "TTFT sum {ttft_sum} s");
}

#[tokio::test]
async fn a_trusted_arrival_stamp_outside_the_horizon_is_refused() {
    let s = Server::start(&config(
        "server: { trust_arrival_time: true, arrival_horizon_s: 60 }\n",
    ))
    .await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 2, "arrival_time": 1.0}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "arrival_time");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_past_its_timeout_fails_and_gives_every_lease_back() {
    let s = Server::start(&config("server: { request_timeout_s: 0.3 }\n")).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b c", "max_tokens": 100000, "ignore_eos": true,
                    "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let t0 = Instant::now();
    let body = r.text().await.unwrap();
    // 100 000 tokens take minutes: anything near the timeout is the timeout.
    assert!(t0.elapsed() < WAIT, "ended by the timeout");
    assert!(body.contains("\"code\":\"request_timeout\""), "{body}");
    wait_for("every pool back to 0", async || {
        s.pools_used().await.iter().all(|(_, used)| *used == 0)
    })
    .await;
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn debug_and_metrics_show_an_idle_worker_as_idle() {
    // One token per pass: of two running requests one is left out of every step, retained
    // by the GPU-step actor. Both clients then leave at once, after which no step runs.
    let s = Server::start(&config("max_num_tokens: 1\n")).await;
    let body = json!({"prompt": "a", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let mut first = s.post("/v1/completions", &body).await.bytes_stream();
    let mut second = s.post("/v1/completions", &body).await.bytes_stream();
    first
        .next()
        .await
        .expect("the first request streams")
        .unwrap();
    second
        .next()
        .await
        .expect("the second request streams")
        .unwrap();
    wait_for("a request retained by a step", async || {
        s.debug().await["gpu_step"]["retained"].as_u64() == Some(1)
    })
    .await;
    drop((first, second));
    wait_for("the GPU-step actor shows nothing retained", async || {
        let g = &s.debug().await["gpu_step"];
        g["retained"] == 0 && g["paused"] == 0
    })
    .await;
    wait_for("every pool gauge at 0", async || {
        let text = s.get("/metrics").await.text().await.unwrap();
        let used: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("genslot_pool_used{"))
            .collect();
        !used.is_empty() && used.iter().all(|l| l.ends_with(" 0"))
    })
    .await;
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_without_max_tokens_is_bounded_by_the_configured_default() {
    // Without the bound it would run to the context's rest, about a million tokens.
    let s = Server::start(&config("server: { default_max_tokens: 7 }\n")).await;
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b c", "ignore_eos": true}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 7);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn debug_shows_the_transfer_line_s2f_learned_from_the_contexts_arrivals() {
    // Transfers of 20 ms + 10 µs a context token, one request at a time.
    let mut cfg = config("");
    (
        cfg.timing.transfer_base_ms,
        cfg.timing.transfer_per_token_us,
    ) = (20.0, 10.0);
    let s = Server::start(&cfg).await;
    for k in 1..=20u32 {
        let prompt: Vec<u32> = (0..100 * k).map(|i| 100 + i % 500).collect();
        let r = s
            .post(
                "/v1/completions",
                &json!({"prompt": prompt, "max_tokens": 1, "ignore_eos": true}),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let t = &s.debug().await["worker"]["queue"]["transfer"];
    assert!(t["samples"].as_u64().unwrap() >= 20, "{t}");
    let (base, per_token) = (
        t["base_s"].as_f64().unwrap(),
        t["per_token_us"].as_f64().unwrap(),
    );
    // The actor messages around each arrival add a little; the fit still finds the line.
    assert!((0.015..0.04).contains(&base), "{t}");
    assert!((5.0..20.0).contains(&per_token), "{t}");
    s.shutdown().await.unwrap();
}

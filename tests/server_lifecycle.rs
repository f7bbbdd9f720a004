//! The server's life cycle over loopback against the mock engine: back-pressure, client
//! disconnects, health / metrics / debug endpoints, graceful shutdown.

mod server_support;

use std::time::Duration;

use futures::StreamExt;
use genslot::server::mock::{MockConfig, MockShutdown, SHUTDOWN_MESSAGE};
use serde_json::{json, Value};
use server_support::*;

#[tokio::test]
async fn a_full_queue_gets_429_and_accepted_requests_still_complete() {
    let s = Server::start(MockConfig {
        max_live: 2,
        token_interval: Duration::from_millis(5),
        ..fast()
    })
    .await;
    let body = json!({"prompt": "a b c", "max_tokens": 20, "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true}});
    // Held, the accepted requests stay live until released; their headers still arrive.
    s.engine.hold(true);
    let first = s.post("/v1/completions", &body).await;
    let second = s.post("/v1/completions", &body).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    assert_eq!(s.engine.live(), 2);
    let third = s.post("/v1/completions", &body).await;
    let e: Value = {
        assert_eq!(third.status(), 429);
        third.json().await.unwrap()
    };
    assert_eq!(e["error"]["type"], "rate_limit_error");
    assert_eq!(e["error"]["code"], "queue_full");
    s.engine.hold(false);
    for r in [first, second] {
        let chunks = chunks(&r.text().await.unwrap());
        assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 20);
    }
    assert!(s.engine.wait_idle(WAIT).await);
    assert!(s.engine.cancelled().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_its_request() {
    let s = Server::start(MockConfig {
        token_interval: Duration::from_millis(5),
        ..fast()
    })
    .await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true, "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let first = body.next().await.expect("a first chunk").unwrap();
    assert!(first.starts_with(b"data: {"));
    assert_eq!(s.engine.live(), 1);
    drop(body);
    assert!(
        s.engine.wait_idle(WAIT).await,
        "the request is released after the disconnect"
    );
    assert_eq!(s.engine.cancelled().len(), 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_gives_up_on_a_whole_answer_cancels_its_request() {
    let s = Server::start(MockConfig {
        token_interval: Duration::from_millis(5),
        ..fast()
    })
    .await;
    let request = s
        .client
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true}))
        .send();
    let client = tokio::spawn(request);
    // The client gives up once the engine holds its request (a timeout of its own could fire
    // before the request is even sent, on a loaded machine).
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.engine.live() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request arrives"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    client.abort();
    assert!(
        client.await.is_err_and(|e| e.is_cancelled()),
        "the client gave up"
    );
    assert!(s.engine.wait_idle(WAIT).await);
    assert_eq!(s.engine.cancelled().len(), 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_client_that_disconnects_while_no_tokens_flow_cancels_its_request() {
    let s = Server::start(fast()).await;
    s.engine.hold(true);
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 50, "ignore_eos": true, "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(s.engine.live(), 1);
    drop(r);
    assert!(
        s.engine.wait_idle(WAIT).await,
        "a waiting or paused request is released when its client leaves"
    );
    assert_eq!(s.engine.cancelled().len(), 1);
    s.engine.hold(false);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_metrics_and_debug_endpoints_answer() {
    // A trusted router's arrival stamps count (`server.trust_arrival_time`).
    let s = Server::start_with(fast(), |app| {
        let mut limits = app.limits().clone();
        limits.arrival.trust = true;
        app.with_limits(limits)
    })
    .await;
    let r = s.get("/health").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));

    // A request that arrived 100 s ago (per the router) lands in TTFT's (80, 160] bucket,
    // which nothing else in these tests reaches.
    let arrival = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - 100.0;
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .header("x-arrival-time", arrival.to_string())
        .json(&json!({"prompt": "a b", "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.engine.submitted()[0].arrival_unix_s, Some(arrival));

    let text = s.get("/metrics").await.text().await.unwrap();
    for name in [
        genslot::metrics::NUM_REQUESTS_RUNNING,
        genslot::metrics::NUM_REQUESTS_WAITING,
        genslot::metrics::NUM_REQUESTS_PAUSED,
        genslot::metrics::PAUSES_TOTAL,
        genslot::metrics::RESUMES_TOTAL,
        genslot::metrics::KV_WAITS_TOTAL,
        genslot::metrics::KV_ABORTS_TOTAL,
        genslot::metrics::TIME_TO_FIRST_TOKEN_SECONDS,
        genslot::metrics::TIME_PER_OUTPUT_TOKEN_SECONDS,
        genslot::metrics::E2E_REQUEST_LATENCY_SECONDS,
        genslot::metrics::REQUEST_SUCCESS_TOTAL,
        genslot::metrics::PROMPT_TOKENS_TOTAL,
        genslot::metrics::GENERATION_TOKENS_TOTAL,
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(text.contains("genslot_time_to_first_token_seconds_bucket{le="));
    assert!(text.contains("genslot_e2e_request_latency_seconds_bucket{le="));
    assert!(text.contains(r#"genslot_resumes_total{forced="true"}"#));
    let bucket = |le: &str| -> u64 {
        let prefix = format!("genslot_time_to_first_token_seconds_bucket{{le=\"{le}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no bucket le={le}"))
    };
    assert!(
        bucket("160") > bucket("80"),
        "TTFT counted from x-arrival-time"
    );

    let r = s.get("/debug/actors").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains('\n'), "pretty-printed");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["engine"], "mock");
    assert_eq!(v["submitted"], 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn graceful_shutdown_lets_in_flight_requests_finish_within_the_drain_window() {
    let s = Server::start(MockConfig {
        shutdown: MockShutdown::Drain,
        ..fast()
    })
    .await;
    s.engine.hold(true);
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 30, "ignore_eos": true, "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let Server { mut http, engine } = s;
    let (base, client) = (http.base.clone(), http.client.clone());
    http.begin_shutdown();
    // The listener closes: new connections are refused.
    let deadline = tokio::time::Instant::now() + WAIT;
    while client.get(format!("{base}/health")).send().await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "still accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The in-flight stream, released well inside the 30 s default window, ends whole.
    engine.hold(false);
    let chunks = chunks(&r.text().await.unwrap());
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 30);
    http.shutdown_within(WAIT).await.unwrap();
    assert_eq!(engine.live(), 0);
    assert!(engine.cancelled().is_empty());
}

#[tokio::test]
async fn shutdown_that_fails_in_flight_requests_says_why() {
    let s = Server::start(MockConfig {
        shutdown: MockShutdown::Fail,
        token_interval: Duration::from_millis(5),
        ..fast()
    })
    .await;
    let streaming = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true, "stream": true}),
        )
        .await;
    let client = s.client.clone();
    let whole_url = s.url("/v1/completions");
    let whole = tokio::spawn(async move {
        client
            .post(whole_url)
            .json(&json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true}))
            .send()
            .await
    });
    let engine = s.engine.clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    while engine.live() < 2 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let done = tokio::spawn(s.shutdown());

    let data = sse_data(&streaming.text().await.unwrap());
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["message"], SHUTDOWN_MESSAGE);
    let whole = whole.await.unwrap().unwrap();
    assert_openai_error(whole, 503, "engine_failed").await;
    done.await.unwrap().unwrap();
    assert_eq!(engine.live(), 0);
    assert!(engine.cancelled().is_empty(), "failed, not cancelled");
}

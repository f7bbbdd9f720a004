//! The HTTP server over loopback, against the in-process mock engine.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use genslot::server::engine::Engine;
use genslot::server::mock::{MockConfig, MockEngine, MockShutdown, SHUTDOWN_MESSAGE};
use genslot::server::tokenize::{Tokenizer, WordTokenizer};
use genslot::server::{serve, App};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(10);

struct Server {
    base: String,
    engine: MockEngine,
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(cfg: MockConfig) -> Self {
        Self::start_with(cfg, |app| app).await
    }

    async fn start_with(cfg: MockConfig, configure: impl FnOnce(App) -> App) -> Self {
        let engine = MockEngine::new(cfg);
        let metrics = genslot::metrics::install_recorder().expect("recorder");
        let app = configure(App::new(
            Arc::new(engine.clone()),
            metrics,
            "genslot-test".into(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, async {
            let _ = stopped.await;
        }));
        Server {
            base,
            engine,
            client: reqwest::Client::new(),
            stop: Some(stop),
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("send")
    }

    async fn post_raw(&self, path: &str, body: &'static str) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send")
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("send")
    }

    async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
    }
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}

/// Splits a finished stream into its JSON chunks, checking it ends with `[DONE]`.
fn chunks(body: &str) -> Vec<Value> {
    let mut data = sse_data(body);
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "stream: {body}");
    data.iter()
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect()
}

fn count_tokens(text: &str) -> usize {
    WordTokenizer::default().encode(text).len()
}

fn prompt_of(words: usize) -> String {
    vec!["word"; words].join(" ")
}

fn fast() -> MockConfig {
    MockConfig::default()
}

#[tokio::test]
async fn streaming_completion_sends_tokens_then_usage_then_done() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "m", "prompt": prompt_of(12), "max_tokens": 6, "stream": true,
                    "ignore_eos": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = chunks(&r.text().await.unwrap());
    let (usage, token_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18})
    );
    let text: String = token_chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        count_tokens(&text),
        6,
        "text {text:?} re-tokenizes to usage"
    );
    let reasons: Vec<&Value> = token_chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .collect();
    assert_eq!(reasons.last().copied(), Some(&json!("length")));
    assert!(reasons[..reasons.len() - 1].iter().all(|r| r.is_null()));
    for c in &chunks {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["model"], "m");
        assert_eq!(c["id"], chunks[0]["id"]);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn streaming_chat_sends_role_then_deltas_then_usage_then_done() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hello there"}],
                    "max_completion_tokens": 5, "stream": true, "ignore_eos": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let chunks = chunks(&r.text().await.unwrap());
    let (usage, deltas) = chunks.split_last().unwrap();
    assert_eq!(deltas[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = deltas
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(count_tokens(&text), 5);
    assert!(deltas
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(
        deltas.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let t = WordTokenizer::default();
    let rendered = t.render_chat(&[genslot::server::tokenize::ChatTurn {
        role: "user".into(),
        content: "Hello there".into(),
    }]);
    assert_eq!(usage["usage"]["prompt_tokens"], t.encode(&rendered).len());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_include_usage_the_stream_has_no_usage_chunk() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b", "max_tokens": 3, "stream": true}),
        )
        .await;
    let chunks = chunks(&r.text().await.unwrap());
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert!(chunks
        .iter()
        .all(|c| c["choices"].as_array().unwrap().len() == 1));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn continuous_usage_puts_running_counts_on_every_chunk() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b", "max_tokens": 4, "stream": true,
                    "stream_options": {"continuous_usage_stats": true}}),
        )
        .await;
    let chunks = chunks(&r.text().await.unwrap());
    let counts: Vec<u64> = chunks
        .iter()
        .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&4));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn non_streaming_completion_and_chat_return_openai_json_with_usage() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt_of(7), "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["model"], "genslot-test",
        "the served name when none is asked"
    );
    assert_eq!(count_tokens(v["choices"][0]["text"].as_str().unwrap()), 4);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11})
    );

    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        count_tokens(v["choices"][0]["message"]["content"].as_str().unwrap()),
        3
    );
    assert_eq!(v["usage"]["completion_tokens"], 3);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn eos_finishes_with_stop_unless_ignore_eos() {
    let s = Server::start(MockConfig {
        eos_after: Some(2),
        ..fast()
    })
    .await;
    let v: Value = s
        .post("/v1/completions", &json!({"prompt": "a", "max_tokens": 9}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 9, "ignore_eos": true}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 9);
    s.shutdown().await.unwrap();
}

async fn assert_openai_error(r: reqwest::Response, status: u16, code: &str) {
    assert_eq!(r.status(), status);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v: Value = r.json().await.expect("error body is JSON");
    let e = &v["error"];
    assert!(
        !e["message"].as_str().unwrap_or("").is_empty(),
        "message in {v}"
    );
    assert!(e["type"].is_string(), "type in {v}");
    assert!(e.get("param").is_some(), "param in {v}");
    assert_eq!(e["code"], code, "{v}");
}

#[tokio::test]
async fn bad_requests_get_400_with_openai_error_json() {
    let s = Server::start(MockConfig {
        max_context_tokens: 50,
        ..fast()
    })
    .await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/v1/completions", json!({"max_tokens": 3}), "missing_field"),
        (
            "/v1/chat/completions",
            json!({"max_tokens": 3}),
            "missing_field",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 0}),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": -5}),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt_of(50), "max_tokens": 1}),
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt_of(40), "max_tokens": 20}),
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 3, "min_tokens": 4}),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "n": 2}),
            "not_supported",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 2}),
            "not_supported",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": "three"}),
            "invalid_json",
        ),
    ];
    for (path, body, code) in cases {
        let r = s.post(path, &body).await;
        assert_openai_error(r, 400, code).await;
    }
    for raw in ["{\"prompt\": \"a\"", "not json", ""] {
        let r = s.post_raw("/v1/completions", raw).await;
        assert_openai_error(r, 400, "invalid_json").await;
    }
    // No content type at all is still read as JSON, never axum's plain-text 415.
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .body("{\"prompt\": \"a\", \"max_tokens\": 1}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_openai_error(s.get("/v1/nothing").await, 404, "not_found").await;
    assert_eq!(
        s.engine.submitted().len(),
        1,
        "only the valid request reached the engine"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn oversized_bodies_get_413_with_error_json() {
    let s = Server::start_with(fast(), |app| app.with_max_body_bytes(1024)).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt_of(1000), "max_tokens": 1}),
        )
        .await;
    assert_openai_error(r, 413, "invalid_body").await;
    s.shutdown().await.unwrap();
}

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
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .timeout(Duration::from_millis(200))
        .json(&json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true}))
        .send()
        .await;
    assert!(r.is_err(), "the client timed out");
    assert!(s.engine.wait_idle(WAIT).await);
    assert_eq!(s.engine.cancelled().len(), 1);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_metrics_and_debug_endpoints_answer() {
    let s = Server::start(fast()).await;
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
async fn graceful_shutdown_drains_in_flight_requests_and_refuses_new_ones() {
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
    let Server {
        base,
        engine,
        client,
        mut stop,
        task,
    } = s;
    stop.take().unwrap().send(()).unwrap();

    // The listener stays open while the engine drains: health says so, new work is refused.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let h = client.get(format!("{base}/health")).send().await.unwrap();
        if h.status() == 503 {
            assert_eq!(h.json::<Value>().await.unwrap()["status"], "shutting_down");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never turned 503"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "a", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_openai_error(refused, 503, "shutting_down").await;

    engine.hold(false);
    let chunks = chunks(&r.text().await.unwrap());
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 30);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("serve returns")
        .unwrap()
        .unwrap();
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

#[tokio::test]
async fn models_lists_the_served_model_with_its_context() {
    let s = Server::start(fast()).await;
    let v: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "genslot-test");
    assert_eq!(v["data"][0]["max_model_len"], s.engine.max_context_tokens());
    s.shutdown().await.unwrap();
}

//! An in-process OpenAI-style streaming mock server on 127.0.0.1:0 with controllable pacing
//! and failures, for loadgen's tests.
#![allow(dead_code)]

/// Running the loadgen binary (integration tests only: examples have no such binary).
#[cfg(test)]
pub mod cli;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// What the mock does with one request.
#[derive(Debug, Clone, Copy)]
pub enum Behavior {
    /// Stream `max_tokens` tokens.
    Stream {
        first_token_delay: Duration,
        inter_chunk_delay: Duration,
        /// Chat only: send an empty `{"role":"assistant"}` delta right away.
        role_chunk: bool,
        /// Tokens per content chunk (the usage chunk reports the true total).
        tokens_per_chunk: u32,
        usage: bool,
    },
    /// Answer with this HTTP status and an error body.
    Status(u16),
    /// Answer with this HTTP status, an error body and `Retry-After: <seconds>`.
    StatusRetryAfter(u16, u64),
    /// Stream this many content chunks, then break the connection.
    DropAfter(u32),
    /// Never answer.
    Hang,
    /// Send one token, then an in-stream `error` object, then `[DONE]`.
    ErrorEvent,
}

impl Behavior {
    pub fn stream(first_ms: u64, gap_ms: u64) -> Self {
        Behavior::Stream {
            first_token_delay: Duration::from_millis(first_ms),
            inter_chunk_delay: Duration::from_millis(gap_ms),
            role_chunk: true,
            tokens_per_chunk: 1,
            usage: true,
        }
    }
}

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub index: u64,
    pub path: String,
    pub body: Value,
    pub arrived: Instant,
    /// The `x-arrival-time` header, if sent.
    pub arrival_header: Option<String>,
}

type Plan = Arc<dyn Fn(u64) -> Behavior + Send + Sync>;

#[derive(Clone)]
struct Mock {
    plan: Plan,
    count: Arc<AtomicU64>,
    seen: Arc<Mutex<Vec<Seen>>>,
    metrics: Option<Arc<dyn Fn(u64) -> String + Send + Sync>>,
    record: bool,
}

pub struct MockServer {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a mock whose `n`-th request (0-based) behaves as `plan(n)`. When `metrics` is set,
/// `GET /metrics` returns `metrics(requests so far)`; otherwise it is a 404.
pub async fn start(
    plan: impl Fn(u64) -> Behavior + Send + Sync + 'static,
    metrics: Option<Arc<dyn Fn(u64) -> String + Send + Sync>>,
) -> MockServer {
    start_on("127.0.0.1:0", plan, metrics, true)
        .await
        .expect("bind mock")
}

/// As [`start`], on a chosen address; `record: false` keeps no request bodies (for long runs).
pub async fn start_on(
    addr: &str,
    plan: impl Fn(u64) -> Behavior + Send + Sync + 'static,
    metrics: Option<Arc<dyn Fn(u64) -> String + Send + Sync>>,
    record: bool,
) -> std::io::Result<MockServer> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mock = Mock {
        plan: Arc::new(plan),
        count: Arc::new(AtomicU64::new(0)),
        seen: seen.clone(),
        metrics,
        record,
    };
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/metrics", get(metrics_route))
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(serde_json::json!({"object": "list", "data": [{"id": "mock"}]}))
            }),
        )
        // Weka prompts reach several MB of text; axum's 2 MB default would answer 413.
        .layer(DefaultBodyLimit::disable())
        .with_state(mock);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(MockServer { addr, seen, task })
}

async fn metrics_route(State(m): State<Mock>) -> Response {
    match &m.metrics {
        Some(f) => f(m.count.load(Ordering::SeqCst)).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn completions(
    State(m): State<Mock>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    respond(m, "/v1/completions", &headers, body, false)
}

async fn chat(State(m): State<Mock>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    respond(m, "/v1/chat/completions", &headers, body, true)
}

fn sse(v: Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn respond(m: Mock, path: &str, headers: &HeaderMap, body: Value, chat: bool) -> Response {
    let arrival_header = headers
        .get("x-arrival-time")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let index = m.count.fetch_add(1, Ordering::SeqCst);
    let max_tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(16) as u32;
    if let Some(mut s) = m.record.then(|| m.seen.lock().ok()).flatten() {
        s.push(Seen {
            index,
            path: path.to_owned(),
            body,
            arrived: Instant::now(),
            arrival_header,
        });
    }
    let behavior = (m.plan)(index);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let content = move |text: &str| {
        if chat {
            sse(json!({"choices": [{"index": 0, "delta": {"content": text}}]}))
        } else {
            sse(json!({"choices": [{"index": 0, "text": text}]}))
        }
    };
    match behavior {
        Behavior::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (
                status,
                Json(json!({"error": {"message": "mock failure", "code": code}})),
            )
                .into_response();
        }
        Behavior::StatusRetryAfter(code, secs) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (
                status,
                [("retry-after", secs.to_string())],
                Json(json!({"error": {"message": "mock refusal", "code": code}})),
            )
                .into_response();
        }
        Behavior::Hang => {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(tx);
            });
        }
        Behavior::ErrorEvent => {
            tokio::spawn(async move {
                let _ = tx.send(Ok(content("tok "))).await;
                let _ = tx
                    .send(Ok(sse(
                        json!({"error": {"message": "engine failed", "code": 503}}),
                    )))
                    .await;
                let _ = tx.send(Ok(Bytes::from("data: [DONE]\n\n"))).await;
            });
        }
        Behavior::DropAfter(n) => {
            tokio::spawn(async move {
                for _ in 0..n {
                    let _ = tx.send(Ok(content("tok "))).await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let _ = tx
                    .send(Err(std::io::Error::other("mock drops the connection")))
                    .await;
            });
        }
        Behavior::Stream {
            first_token_delay,
            inter_chunk_delay,
            role_chunk,
            tokens_per_chunk,
            usage,
        } => {
            tokio::spawn(async move {
                if chat && role_chunk {
                    let role = sse(
                        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
                    );
                    let _ = tx.send(Ok(role)).await;
                }
                tokio::time::sleep(first_token_delay).await;
                let per = tokens_per_chunk.max(1);
                let chunks = max_tokens.div_ceil(per);
                for i in 0..chunks {
                    if i > 0 {
                        tokio::time::sleep(inter_chunk_delay).await;
                    }
                    let _ = tx.send(Ok(content("tok "))).await;
                }
                if usage {
                    let u = json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": max_tokens, "total_tokens": max_tokens + 1}});
                    let _ = tx.send(Ok(sse(u))).await;
                }
                let _ = tx.send(Ok(Bytes::from("data: [DONE]\n\n"))).await;
            });
        }
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A base URL where nothing listens.
pub async fn closed_port_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

/// A run configuration for tests: no progress bar, completions endpoint.
pub fn config(
    url: &str,
    duration: Duration,
    max_requests: Option<u64>,
) -> loadgen::runner::RunConfig {
    loadgen::runner::RunConfig {
        endpoint: loadgen::client::Endpoint {
            base_url: url.to_owned(),
            kind: loadgen::client::EndpointKind::Completions,
            model: "mock".to_owned(),
            token_ids: false,
            request_timeout: Duration::from_secs(60),
        },
        duration,
        max_requests,
        grace: Duration::from_millis(300),
        progress: false,
        scrape_metrics: true,
        send_arrival_time: false,
        send_jitter: Duration::ZERO,
        jitter_seed: 0,
    }
}

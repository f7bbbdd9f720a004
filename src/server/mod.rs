//! The OpenAI-compatible HTTP front end (SPEC §7), built against the [`engine::Engine`] seam.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
//! `GET /health`, `GET /metrics`, `GET /debug/actors`.

pub mod completions;
pub mod engine;
pub mod error;
pub mod latency;
pub mod mock;
pub mod request;
pub mod response;
pub mod stream;
pub mod tokenize;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use engine::Engine;
use error::ApiError;
use tokenize::{Tokenizer, WordTokenizer};

/// Agentic prompts run to hundreds of thousands of tokens; a token-id array of 200k ids is
/// about 1.4 MB of JSON, well under this.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The server's shared state: the engine, how to tokenize, and whether it is draining.
#[derive(Clone)]
pub struct App {
    engine: Arc<dyn Engine>,
    metrics: PrometheusHandle,
    model_name: Arc<str>,
    tokenizer: Arc<dyn Tokenizer>,
    draining: Arc<AtomicBool>,
    max_body_bytes: usize,
}

impl App {
    /// With the default [`WordTokenizer`] and [`DEFAULT_MAX_BODY_BYTES`].
    pub fn new(engine: Arc<dyn Engine>, metrics: PrometheusHandle, model_name: String) -> Self {
        App {
            engine,
            metrics,
            model_name: model_name.into(),
            tokenizer: Arc::new(WordTokenizer::default()),
            draining: Arc::new(AtomicBool::new(false)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    pub fn with_tokenizer(mut self, tokenizer: Arc<dyn Tokenizer>) -> Self {
        self.tokenizer = tokenizer;
        self
    }

    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// From now on `/health` answers 503 and new requests are refused with 503.
    pub fn begin_shutdown(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/completions", post(completions::completions))
            .route("/v1/chat/completions", post(completions::chat_completions))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .route("/debug/actors", get(debug_actors))
            .fallback(not_found)
            .layer(DefaultBodyLimit::max(self.max_body_bytes))
            .with_state(self.clone())
    }
}

/// The router for `engine` with default settings. Use [`App`] + [`serve`] for graceful
/// shutdown.
pub fn router(engine: Arc<dyn Engine>, metrics: PrometheusHandle, model_name: String) -> Router {
    App::new(engine, metrics, model_name).router()
}

/// Serves `app` until `shutdown_signal` resolves, then shuts down gracefully: `/health` turns
/// 503 and new requests get 503 while the engine drains or fails every in-flight request
/// (each stream ends with its finish reason or an error), then the listener closes and this
/// returns once every connection is done.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown_signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = crate::metrics::spawn_upkeep(app.metrics.clone());
    let drain = app.clone();
    let result = axum::serve(listener, app.router())
        .with_graceful_shutdown(async move {
            shutdown_signal.await;
            tracing::info!("shutting down: draining in-flight requests");
            drain.begin_shutdown();
            drain.engine.shutdown().await;
            tracing::info!("engine drained; closing connections");
        })
        .await;
    upkeep.abort();
    result
}

async fn health(State(app): State<App>) -> Response {
    if app.is_shutting_down() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(app): State<App>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

async fn debug_actors(State(app): State<App>) -> Response {
    let state = app.engine.debug_state().await;
    let text = serde_json::to_string_pretty(&state).unwrap_or_else(|_| state.to_string());
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

async fn models(State(app): State<App>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": &*app.model_name,
            "object": "model",
            "created": latency::now_unix_s() as u64,
            "owned_by": "genslot",
            "max_model_len": app.engine.max_context_tokens(),
        }],
    }))
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such route".into(),
        param: None,
        code: "not_found",
    }
}

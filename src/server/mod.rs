//! The OpenAI-compatible HTTP front end (SPEC §7), built against the [`engine::Engine`] seam.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
//! `GET /v1/models/{id}`, `GET /health`, `GET /metrics`, `GET /debug/actors`. Every error the
//! router gives, 404 and 405 included, is an OpenAI-style JSON body (HTTP that hyper cannot
//! parse never reaches it: `listen.rs`).

pub mod arrival;
mod body;
pub mod chat;
pub mod completions;
pub mod engine;
pub mod error;
pub mod fields;
pub mod latency;
pub mod limits;
pub mod listen;
pub mod mock;
pub mod models;
pub mod output;
pub mod params;
pub mod request;
pub mod response;
pub mod stop;
pub mod stream;
pub mod tokenize;
pub mod tokenizer_json;
pub mod unknown;
pub mod unsupported;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use engine::Engine;
use error::ApiError;
pub use limits::Limits;
pub use listen::serve;
use models::ModelNames;
use tokenize::{Tokenizer, WordTokenizer};

/// The server's shared state: the engine, how to tokenize, the served model's names, the
/// limits, and whether it is draining.
#[derive(Clone)]
pub struct App {
    engine: Arc<dyn Engine>,
    metrics: PrometheusHandle,
    models: Arc<ModelNames>,
    tokenizer: Arc<dyn Tokenizer>,
    draining: Arc<AtomicBool>,
    limits: Arc<Limits>,
}

impl App {
    /// With the default [`WordTokenizer`] and [`Limits`]; `model_name` is the served id.
    pub fn new(engine: Arc<dyn Engine>, metrics: PrometheusHandle, model_name: String) -> Self {
        App {
            engine,
            metrics,
            models: Arc::new(ModelNames::new(model_name)),
            tokenizer: Arc::new(WordTokenizer::default()),
            draining: Arc::new(AtomicBool::new(false)),
            limits: Arc::new(Limits::default()),
        }
    }

    pub fn with_tokenizer(mut self, tokenizer: Arc<dyn Tokenizer>) -> Self {
        self.tokenizer = tokenizer;
        self
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = Arc::new(limits);
        self
    }

    /// Other names a request's `model` may use.
    pub fn with_model_aliases(mut self, aliases: Vec<String>) -> Self {
        self.models = Arc::new(ModelNames::new(self.models.id.clone()).with_aliases(aliases));
        self
    }

    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        let mut limits = (*self.limits).clone();
        limits.max_body_bytes = bytes;
        self.limits = Arc::new(limits);
        self
    }

    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
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
            .route("/v1/models/{*id}", get(model))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .route("/debug/actors", get(debug_actors))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self.clone())
    }
}

/// The router for `engine` with default settings. Use [`App`] + [`serve`] for limits and
/// graceful shutdown.
pub fn router(engine: Arc<dyn Engine>, metrics: PrometheusHandle, model_name: String) -> Router {
    App::new(engine, metrics, model_name).router()
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

/// OpenAI's model list: the served model (aliases are accepted names, not other models).
async fn models(State(app): State<App>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [model_card(&app)]}))
}

/// OpenAI's model retrieval: the served model by its id or an alias (ids may hold `/`).
async fn model(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    app.models.resolve(Some(&id))?;
    Ok(Json(model_card(&app)))
}

fn model_card(app: &App) -> serde_json::Value {
    json!({
        "id": &app.models.id,
        "object": "model",
        "created": latency::now_unix_s() as u64,
        "owned_by": "genslot",
        "max_model_len": app.engine.max_context_tokens(),
        "aliases": &app.models.aliases,
    })
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such route".into(),
        param: None,
        code: "not_found",
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: "this route does not take that method (POST for completions, GET otherwise)"
            .into(),
        param: None,
        code: "method_not_allowed",
    }
}

//! `POST /v1/completions` and `POST /v1/chat/completions`: parse, submit, answer (streaming or
//! whole), recording per-request metrics on the way.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::metrics as m;

use super::body;
use super::error::ApiError;
use super::latency::{now_unix_s, record_rejection, RecordedRequest};
use super::output::{timeout_message, End, Output};
use super::request::{parse_request, Endpoint, ParseContext, ParsedRequest};
use super::response::ResponseMeta;
use super::stream::{sse_response, StreamSetup};
use super::App;

/// Header carrying the upstream arrival (unix seconds) when the body has no `arrival_time`.
pub const ARRIVAL_HEADER: &str = "x-arrival-time";

pub(super) async fn completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(app, Endpoint::Completions, headers, body).await
}

pub(super) async fn chat_completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(app, Endpoint::ChatCompletions, headers, body).await
}

async fn handle(app: App, endpoint: Endpoint, headers: HeaderMap, body: Body) -> Response {
    let received = now_unix_s();
    let s = match accept(&app, endpoint, headers, body, received).await {
        Ok(s) => s,
        Err(e) => {
            record_rejection(e.code);
            return e.into_response();
        }
    };
    let meta = ResponseMeta::new(endpoint, s.output.id(), received as u64, s.model);
    let record = RecordedRequest::start(s.arrival.unwrap_or(received), s.prompt_tokens);
    let setup = StreamSetup {
        meta,
        record,
        prompt_tokens: s.prompt_tokens as u64,
        include_usage: s.include_usage,
        continuous_usage: s.continuous_usage,
    };
    if s.stream {
        sse_response(s.output, setup)
    } else {
        match collect(s.output, setup).await {
            Ok(body) => Json(body).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// An accepted request and how to answer it.
struct Submitted {
    output: Output,
    model: String,
    arrival: Option<f64>,
    prompt_tokens: usize,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
}

/// Bodies up to this size are parsed and tokenized on the async worker that read them; a
/// larger one (up to `server.max_body_bytes`) takes milliseconds and goes to the blocking pool,
/// so that it delays no other connection.
const PARSE_INLINE_BYTES: usize = 64 * 1024;

async fn accept(
    app: &App,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
    received: f64,
) -> Result<Submitted, ApiError> {
    if app.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let body = body::read(&headers, body, &app.limits).await?;
    if body.len() <= PARSE_INLINE_BYTES {
        return submit(app, endpoint, &headers, &body, received);
    }
    let app = app.clone();
    tokio::task::spawn_blocking(move || submit(&app, endpoint, &headers, &body, received))
        .await
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("parsing the request failed: {e}"),
            param: None,
            code: "internal_error",
        })?
}

fn submit(
    app: &App,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
    received: f64,
) -> Result<Submitted, ApiError> {
    // Read only when trusted: otherwise the header is ignored like the body's field.
    let arrival_header = match headers.get(ARRIVAL_HEADER) {
        Some(v) if app.limits.arrival.trust => Some(v.to_str().map_err(|_| {
            ApiError::invalid(
                "invalid_value",
                Some(ARRIVAL_HEADER),
                "the x-arrival-time header is not ASCII".into(),
            )
        })?),
        _ => None,
    };
    let ctx = ParseContext {
        tokenizer: app.tokenizer.as_ref(),
        max_context_tokens: app.engine.max_context_tokens(),
        default_max_tokens: app.limits.default_max_tokens,
        models: &app.models,
        arrival: app.limits.arrival,
        received_unix_s: received,
    };
    let ParsedRequest {
        gen,
        model,
        stream,
        include_usage,
        continuous_usage,
        ..
    } = parse_request(endpoint, body, arrival_header, &ctx)?;
    let (arrival, prompt_tokens, min_tokens) =
        (gen.arrival_unix_s, gen.prompt_tokens.len(), gen.min_tokens);
    let stop = gen.stop.clone();
    let submission = app.engine.submit(gen)?;
    Ok(Submitted {
        output: Output::new(
            submission,
            app.tokenizer.clone(),
            stop,
            min_tokens,
            app.limits.request_timeout,
        ),
        model,
        arrival,
        prompt_tokens,
        stream,
        include_usage,
        continuous_usage,
    })
}

/// Waits for the whole answer. If the client goes away first, axum drops this future and
/// with it the output, which cancels the request.
async fn collect(
    mut output: Output,
    mut setup: StreamSetup,
) -> Result<serde_json::Value, ApiError> {
    let mut text = String::new();
    while let Some(piece) = output.next().await {
        text.push_str(&piece.text);
        setup.record.on_tokens(piece.tokens);
        match piece.end {
            None => {}
            Some(End::Finished(reason)) => {
                setup.record.on_finish(reason);
                return Ok(setup.meta.full(&text, reason, setup.usage()));
            }
            Some(End::Failed(message)) => {
                setup.record.on_fail(m::FAILED_ENGINE);
                return Err(ApiError::engine_failed(message));
            }
            Some(End::TimedOut(after)) => {
                setup.record.on_fail(m::FAILED_TIMEOUT);
                return Err(ApiError::timed_out(timeout_message(after)));
            }
        }
    }
    setup.record.on_fail(m::FAILED_ENGINE);
    Err(ApiError::engine_failed(
        "the request ended without an answer".into(),
    ))
}

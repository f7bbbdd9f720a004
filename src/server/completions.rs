//! `POST /v1/completions` and `POST /v1/chat/completions`: parse, submit, answer (streaming or
//! whole), recording per-request metrics on the way.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::engine::{EngineEvent, Submission};
use super::error::ApiError;
use super::latency::{now_unix_s, record_rejection, RecordedRequest};
use super::request::{parse_request, Endpoint};
use super::response::{ResponseMeta, Usage};
use super::stream::{sse_response, StreamSetup};
use super::App;

/// Header carrying the upstream arrival (unix seconds) when the body has no `arrival_time`.
pub const ARRIVAL_HEADER: &str = "x-arrival-time";

pub(super) async fn completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(app, Endpoint::Completions, headers, body).await
}

pub(super) async fn chat_completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(app, Endpoint::ChatCompletions, headers, body).await
}

async fn handle(
    app: App,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let received = now_unix_s();
    let submitted = match submit(&app, endpoint, &headers, body) {
        Ok(s) => s,
        Err(e) => {
            record_rejection(e.code);
            return e.into_response();
        }
    };
    let Submitted {
        submission,
        model,
        arrival,
        prompt_tokens,
        stream,
        include_usage,
        continuous_usage,
    } = submitted;
    let meta = ResponseMeta::new(
        endpoint,
        submission.id,
        received as u64,
        model.unwrap_or_else(|| app.model_name.to_string()),
    );
    let record = RecordedRequest::start(arrival.unwrap_or(received), prompt_tokens);
    let setup = StreamSetup {
        meta,
        tokenizer: app.tokenizer.clone(),
        record,
        prompt_tokens: prompt_tokens as u64,
        include_usage,
        continuous_usage,
    };
    if stream {
        sse_response(submission, setup)
    } else {
        match collect(submission, setup).await {
            Ok(body) => Json(body).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

struct Submitted {
    submission: Submission,
    model: Option<String>,
    arrival: Option<f64>,
    prompt_tokens: usize,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
}

fn submit(
    app: &App,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Submitted, ApiError> {
    if app.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let body = body.map_err(|r| ApiError {
        status: r.status(),
        message: r.body_text(),
        param: None,
        code: "invalid_body",
    })?;
    let arrival_header = match headers.get(ARRIVAL_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::invalid(
                "invalid_value",
                Some(ARRIVAL_HEADER),
                "the x-arrival-time header is not ASCII".into(),
            )
        })?),
    };
    let parsed = parse_request(
        endpoint,
        &body,
        arrival_header,
        app.tokenizer.as_ref(),
        app.engine.max_context_tokens(),
    )?;
    let arrival = parsed.gen.arrival_unix_s;
    let prompt_tokens = parsed.gen.prompt_tokens.len();
    let submission = app.engine.submit(parsed.gen)?;
    Ok(Submitted {
        submission,
        model: parsed.model,
        arrival,
        prompt_tokens,
        stream: parsed.stream,
        include_usage: parsed.include_usage,
        continuous_usage: parsed.continuous_usage,
    })
}

/// Waits for the whole answer. If the client goes away first, axum drops this future and
/// with it the submission, which cancels the request.
async fn collect(
    mut submission: Submission,
    mut setup: StreamSetup,
) -> Result<serde_json::Value, ApiError> {
    let mut text = String::new();
    loop {
        match submission.recv().await {
            Some(EngineEvent::Token { id }) => {
                text.push_str(&setup.tokenizer.decode_token(id));
                setup.record.on_tokens(1);
            }
            Some(EngineEvent::Finished { reason }) => {
                let reason = reason.as_openai();
                setup.record.on_finish(reason);
                let usage = Usage {
                    prompt_tokens: setup.prompt_tokens,
                    completion_tokens: setup.record.tokens(),
                };
                return Ok(setup.meta.full(&text, reason, usage));
            }
            Some(EngineEvent::Failed { message }) => {
                setup.record.on_fail();
                return Err(ApiError::engine_failed(message));
            }
            None => {
                setup.record.on_fail();
                return Err(ApiError::engine_failed(
                    "the engine dropped the request without finishing it".into(),
                ));
            }
        }
    }
}

//! Reading a request body within its two limits (`server.max_body_bytes`,
//! `server.body_read_timeout_s`).
//!
//! The size is checked against `Content-Length` before a byte is read, so an announced body
//! past the limit is refused at once instead of after it has been sent, and again as the bytes
//! arrive (a chunked body has no length). The deadline covers the whole body: a client that
//! drips a byte now and then cannot hold its connection, one of `max_connections`, for longer.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use futures::StreamExt;

use super::error::ApiError;
use super::limits::Limits;

/// The body, whole, or the error to answer: 413 past the size limit, 408 past the deadline,
/// 400 when the client broke the body off.
pub(super) async fn read(
    headers: &HeaderMap,
    body: Body,
    limits: &Limits,
) -> Result<Bytes, ApiError> {
    let max = limits.max_body_bytes;
    if let Some(announced) = content_length(headers) {
        if announced > max as u64 {
            return Err(too_large(max));
        }
    }
    match tokio::time::timeout(limits.body_read_timeout, collect(body, max)).await {
        Ok(read) => read,
        Err(_) => Err(timed_out(limits.body_read_timeout)),
    }
}

/// No allocation follows the announced length: a client may announce more than it sends.
async fn collect(body: Body, max: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut whole = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::invalid(
                "invalid_body",
                None,
                format!("the request body could not be read: {e}"),
            )
        })?;
        if whole.len() + chunk.len() > max {
            return Err(too_large(max));
        }
        whole.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(whole))
}

/// hyper has already refused a malformed `Content-Length`; an unreadable one counts as absent.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn too_large(max: usize) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("the request body is larger than {max} bytes (server.max_body_bytes)"),
        param: None,
        code: "invalid_body",
    }
}

fn timed_out(limit: Duration) -> ApiError {
    ApiError {
        status: StatusCode::REQUEST_TIMEOUT,
        message: format!(
            "the request body did not arrive whole within {} s (server.body_read_timeout_s)",
            limit.as_secs_f64()
        ),
        param: None,
        code: "body_timeout",
    }
}

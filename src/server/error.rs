//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}`.

use std::borrow::Cow;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::engine::SubmitError;

/// An error the HTTP layer returns to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one (a field the server does not know
    /// is named as the client spelt it).
    pub param: Option<Cow<'static, str>>,
    /// A stable machine-readable code; also the `reason` label of the rejection metric.
    pub code: &'static str,
}

impl ApiError {
    pub fn invalid(code: &'static str, param: Option<&'static str>, message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
            param: param.map(Cow::Borrowed),
            code,
        }
    }

    /// The param at fault, as a plain string.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    pub fn unsupported(param: &'static str, what: &str) -> Self {
        Self::invalid(
            "not_supported",
            Some(param),
            format!("{what} is not supported by this server"),
        )
    }

    pub fn shutting_down() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down".into(),
            param: None,
            code: "shutting_down",
        }
    }

    /// The engine failed a request it had accepted.
    pub fn engine_failed(message: String) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message,
            param: None,
            code: "engine_failed",
        }
    }

    /// The request ran past `server.request_timeout_s`.
    pub fn timed_out(message: String) -> Self {
        ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message,
            param: None,
            code: "request_timeout",
        }
    }

    /// OpenAI's `type` field, derived from the status as vLLM does; a timeout is told apart
    /// from a fault, since a client retries the one and reports the other.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "internal_error",
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let (status, code) = match e {
            SubmitError::QueueFull { .. } => (StatusCode::TOO_MANY_REQUESTS, "queue_full"),
            SubmitError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            SubmitError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        };
        ApiError {
            status,
            message: e.to_string(),
            param: None,
            code,
        }
    }
}

/// Seconds a client refused for a full queue should wait before retrying (`Retry-After`).
pub const RETRY_AFTER_S: u32 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_S),
            );
        }
        response
    }
}

//! One request's measurement, and its per-request JSONL form.
//!
//! The JSONL line follows AIPerf's `profile_export.jsonl` shape (`metadata`, `metrics` with
//! `{value, unit}`, `error`) so tools written for AIPerf exports read ours too.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Why a request did not complete. Counted in the summary, never fatal to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The server answered with a non-2xx status.
    Http,
    /// No connection (refused, reset before the response head, DNS).
    Connect,
    /// The response started but the stream ended or broke before `data: [DONE]`.
    DroppedStream,
    /// The server sent an `error` object inside the stream.
    StreamError,
    /// The request ran past `--request-timeout`.
    Timeout,
    /// Still in flight when the run's grace period ended.
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestError {
    pub kind: ErrorKind,
    /// HTTP status for `Http`.
    pub status: Option<u16>,
    pub message: String,
    /// `Http`: the response's `Retry-After`, in seconds from when it arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<f64>,
}

impl RequestError {
    /// The key under which the summary counts this error, e.g. `http_500`, `dropped_stream`.
    pub fn key(&self) -> String {
        match (self.kind, self.status) {
            (ErrorKind::Http, Some(s)) => format!("http_{s}"),
            (kind, _) => match serde_json::to_value(kind) {
                Ok(Value::String(s)) => s,
                _ => format!("{kind:?}"),
            },
        }
    }
}

/// How a request ended: each one lands in exactly one of the summary's three counts
/// (`request_count`, `error_request_count`, `cancelled_request_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// Any error but a run-end cancellation.
    Failed,
    /// Still in flight when the run's grace period ended; not an error.
    Cancelled,
}

/// Everything measured about one request. Times are seconds since the run started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: u64,
    /// Closed-loop lane; `None` for open-loop traffic.
    pub lane: Option<usize>,
    /// Index of the trace session (or open-loop row) the request came from.
    pub session: Option<usize>,
    /// Closed loop: which replay of a session tree (AIPerf's correlation id).
    pub conversation: Option<u64>,
    pub warmup: bool,
    pub input_tokens: u32,
    pub max_tokens: u32,
    /// When the source wanted it sent.
    pub scheduled_s: f64,
    /// When it was actually sent.
    pub start_s: f64,
    /// When the response head arrived.
    pub ack_s: Option<f64>,
    /// When the last byte (or the error) arrived.
    pub end_s: f64,
    /// Time to the first chunk with non-empty content.
    pub ttft_ms: Option<f64>,
    /// Gaps between consecutive content chunks.
    pub chunk_gaps_ms: Vec<f64>,
    pub content_chunks: u32,
    /// `usage.completion_tokens` of the final chunk when the server sent it.
    pub usage_output_tokens: Option<u32>,
    pub error: Option<RequestError>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    pub fn outcome(&self) -> Outcome {
        match &self.error {
            None => Outcome::Completed,
            Some(e) if e.kind == ErrorKind::Cancelled => Outcome::Cancelled,
            Some(_) => Outcome::Failed,
        }
    }

    pub fn latency_ms(&self) -> f64 {
        (self.end_s - self.start_s) * 1e3
    }

    /// Output tokens: the server's own count, else one per content chunk.
    pub fn output_tokens(&self) -> u32 {
        self.usage_output_tokens.unwrap_or(self.content_chunks)
    }

    /// AIPerf's per-request inter-token latency: (latency − TTFT) / (output tokens − 1).
    pub fn inter_token_latency_ms(&self) -> Option<f64> {
        let ttft = self.ttft_ms?;
        let n = self.output_tokens();
        (n > 1).then(|| (self.latency_ms() - ttft) / f64::from(n - 1))
    }

    /// AIPerf-shaped JSONL object. `epoch_ns` is the wall-clock time of the run's start.
    pub fn to_export_json(&self, epoch_ns: u128) -> Value {
        let ns = |s: f64| epoch_ns + (s.max(0.0) * 1e9) as u128;
        let mut metrics = serde_json::Map::new();
        let mut put = |name: &str, value: Value, unit: &str| {
            metrics.insert(name.to_owned(), json!({ "value": value, "unit": unit }));
        };
        put("input_sequence_length", json!(self.input_tokens), "tokens");
        if self.ok() {
            put("request_latency", json!(self.latency_ms()), "ms");
            if let Some(t) = self.ttft_ms {
                put("time_to_first_token", json!(t), "ms");
            }
            put("inter_chunk_latency", json!(self.chunk_gaps_ms), "ms");
            put(
                "output_sequence_length",
                json!(self.output_tokens()),
                "tokens",
            );
            if let Some(itl) = self.inter_token_latency_ms().filter(|v| *v > 0.0) {
                put("inter_token_latency", json!(itl), "ms");
                put(
                    "output_token_throughput_per_user",
                    json!(1e3 / itl),
                    "tokens/sec/user",
                );
            }
        }
        let cancelled = self.outcome() == Outcome::Cancelled;
        json!({
            "metadata": {
                "x_request_id": self.id.to_string(),
                "conversation_id": self.session.map(|s| s.to_string()),
                "x_correlation_id": self.conversation.map(|c| c.to_string()),
                "lane": self.lane,
                "request_scheduled_ns": ns(self.scheduled_s),
                "request_start_ns": ns(self.start_s),
                "request_ack_ns": self.ack_s.map(ns),
                "request_end_ns": ns(self.end_s),
                "benchmark_phase": if self.warmup { "warmup" } else { "profiling" },
                "was_cancelled": cancelled,
                "cancellation_time_ns": cancelled.then(|| ns(self.end_s)),
                "max_tokens": self.max_tokens,
            },
            "metrics": metrics,
            "error": self.error.as_ref().map(|e| json!({
                "code": e.status,
                "type": e.key(),
                "message": e.message,
            })),
        })
    }
}

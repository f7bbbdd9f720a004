//! The streaming OpenAI client: sends one request and times its SSE stream.
//!
//! TTFT is taken at the first chunk with non-empty content (`choices[0].text` or
//! `choices[0].delta.content`): servers commonly open a chat stream with an empty
//! `{"role": "assistant"}` delta, which is not a token. Gaps between content chunks are the
//! inter-chunk latencies. The output token count comes from the final `usage` chunk when
//! present, else one token per content chunk. Every failure becomes a [`RequestError`]: a run
//! never stops because one request failed.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::backoff::parse_retry_after;
use crate::prompt::{text_prompt, token_id_prompt, PromptSpec};
use crate::record::{ErrorKind, RequestError, RequestRecord};
use crate::source::Job;
use crate::sse::{SseDecoder, SseEvent};

/// Which OpenAI route to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointKind {
    Completions,
    Chat,
}

/// Where and how to send requests.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The server's root, e.g. `http://127.0.0.1:8000`, without `/v1` (the command line's
    /// `--url` is normalised to it once, by [`crate::cli::parse_base_url`]).
    pub base_url: String,
    pub kind: EndpointKind,
    pub model: String,
    /// Send `prompt` as token ids instead of text (completions only).
    pub token_ids: bool,
    /// Whole-request limit; past it the request counts as a timeout.
    pub request_timeout: Duration,
}

impl Endpoint {
    fn root(&self) -> &str {
        self.base_url.trim_end_matches('/')
    }

    pub fn url(&self) -> String {
        match self.kind {
            EndpointKind::Completions => format!("{}/v1/completions", self.root()),
            EndpointKind::Chat => format!("{}/v1/chat/completions", self.root()),
        }
    }

    /// `GET /metrics` on the same server.
    pub fn metrics_url(&self) -> String {
        format!("{}/metrics", self.root())
    }

    /// The JSON body for one job.
    pub fn body(&self, job: &Job) -> Value {
        let spec = PromptSpec {
            input_tokens: job.input_tokens,
            hash_ids: &job.hash_ids,
            block_size: job.block_size,
            salt: job.prefix_salt,
            request_id: job.id,
        };
        let max_tokens = job.max_tokens.max(1);
        let common = json!({
            "model": self.model,
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        let mut body = common;
        match self.kind {
            EndpointKind::Completions if self.token_ids => {
                body["prompt"] = json!(token_id_prompt(&spec));
            }
            EndpointKind::Completions => body["prompt"] = json!(text_prompt(&spec)),
            EndpointKind::Chat => {
                body["messages"] = json!([{ "role": "user", "content": text_prompt(&spec) }]);
            }
        }
        body
    }
}

/// Why a wait was cut short.
enum Interrupt {
    Cancelled,
    Timeout,
}

/// Awaits `fut` unless the run cancels it or the request deadline passes first.
async fn guarded<F: std::future::Future>(
    fut: F,
    cancel: &mut watch::Receiver<bool>,
    deadline: tokio::time::Instant,
) -> Result<F::Output, Interrupt> {
    tokio::select! {
        out = fut => Ok(out),
        _ = cancel.wait_for(|c| *c) => Err(Interrupt::Cancelled),
        _ = tokio::time::sleep_until(deadline) => Err(Interrupt::Timeout),
    }
}

/// Content text of one stream chunk, if any.
fn chunk_content(v: &Value) -> Option<&str> {
    let choice = v.get("choices")?.get(0)?;
    choice
        .get("text")
        .and_then(Value::as_str)
        .or_else(|| choice.get("delta")?.get("content")?.as_str())
}

/// Sends `job` and measures it. `t0` is the run's start; record times are relative to it.
/// `arrival_unix_s`, when given, goes out as the `x-arrival-time` header (the upstream
/// arrival a genslot server measures TTFT from; other servers ignore the header).
pub async fn execute(
    http: &reqwest::Client,
    ep: &Endpoint,
    job: &Job,
    t0: Instant,
    arrival_unix_s: Option<f64>,
    mut cancel: watch::Receiver<bool>,
) -> RequestRecord {
    let since = |t: Instant| t.duration_since(t0).as_secs_f64();
    // Prompt synthesis and JSON encoding happen before the clock starts: TTFT is the
    // server's (and the network's) time only.
    let mut post = http.post(ep.url()).json(&ep.body(job));
    if let Some(t) = arrival_unix_s {
        post = post.header("x-arrival-time", format!("{t:.6}"));
    }
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + ep.request_timeout);
    let mut rec = RequestRecord {
        id: job.id,
        lane: job.lane,
        session: job.session,
        conversation: job.conversation,
        warmup: job.warmup,
        input_tokens: job.input_tokens,
        max_tokens: job.max_tokens.max(1),
        scheduled_s: job.send_at,
        start_s: since(start),
        ack_s: None,
        end_s: since(start),
        ttft_ms: None,
        chunk_gaps_ms: Vec::new(),
        content_chunks: 0,
        usage_output_tokens: None,
        error: None,
    };
    let result = stream_into(post, start, &mut rec, &mut cancel, deadline).await;
    rec.end_s = since(Instant::now());
    if let Err(e) = result {
        rec.error = Some(e);
    }
    rec
}

fn fail(kind: ErrorKind, message: impl Into<String>) -> RequestError {
    RequestError {
        kind,
        status: None,
        message: message.into(),
        retry_after_s: None,
    }
}

/// Why a connection could not be made, in a few words ("connection refused"): the
/// operating system's error at the bottom of reqwest's chain, else the whole chain.
pub fn connect_failure(e: &reqwest::Error) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                std::io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
                _ => io.to_string(),
            };
        }
        cause = c.source();
    }
    with_causes(e)
}

/// reqwest's own message is terse ("error sending request"); the cause says why.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

fn interrupted(i: Interrupt) -> RequestError {
    match i {
        Interrupt::Cancelled => fail(ErrorKind::Cancelled, "cancelled at the end of the run"),
        Interrupt::Timeout => fail(ErrorKind::Timeout, "request timeout"),
    }
}

async fn stream_into(
    post: reqwest::RequestBuilder,
    start: Instant,
    rec: &mut RequestRecord,
    cancel: &mut watch::Receiver<bool>,
    deadline: tokio::time::Instant,
) -> Result<(), RequestError> {
    let t0_offset = rec.start_s;
    let rel = |t: Instant| t0_offset + t.duration_since(start).as_secs_f64();
    let send = post.send();
    let resp = guarded(send, cancel, deadline)
        .await
        .map_err(interrupted)?
        .map_err(|e| {
            if e.is_timeout() {
                fail(ErrorKind::Timeout, with_causes(&e))
            } else if e.is_connect() {
                fail(ErrorKind::Connect, connect_failure(&e))
            } else {
                fail(ErrorKind::Connect, with_causes(&e))
            }
        })?;
    rec.ack_s = Some(rel(Instant::now()));
    let status = resp.status();
    if !status.is_success() {
        let retry_after_s = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
        let text = guarded(resp.text(), cancel, deadline)
            .await
            .ok()
            .and_then(Result::ok);
        return Err(RequestError {
            kind: ErrorKind::Http,
            status: Some(status.as_u16()),
            message: text.unwrap_or_default().chars().take(300).collect(),
            retry_after_s,
        });
    }
    let mut stream = resp.bytes_stream();
    let mut decoder = SseDecoder::new();
    let mut last_content: Option<Instant> = None;
    loop {
        let piece = guarded(stream.next(), cancel, deadline)
            .await
            .map_err(interrupted)?;
        let events = match piece {
            Some(Ok(bytes)) => decoder.push(&bytes),
            Some(Err(e)) => return Err(fail(ErrorKind::DroppedStream, with_causes(&e))),
            None => {
                let tail = decoder.finish();
                let done = tail.contains(&SseEvent::Done);
                handle_events(tail, rec, &mut last_content, start)?;
                if done {
                    return Ok(());
                }
                return Err(fail(ErrorKind::DroppedStream, "stream ended before [DONE]"));
            }
        };
        if handle_events(events, rec, &mut last_content, start)? {
            return Ok(());
        }
    }
}

/// Applies decoded events to the record; `Ok(true)` once `[DONE]` arrived.
fn handle_events(
    events: Vec<SseEvent>,
    rec: &mut RequestRecord,
    last_content: &mut Option<Instant>,
    start: Instant,
) -> Result<bool, RequestError> {
    let now = Instant::now();
    for ev in events {
        let data = match ev {
            SseEvent::Done => return Ok(true),
            SseEvent::Data(d) => d,
        };
        let v: Value = serde_json::from_str(&data).map_err(|e| {
            fail(
                ErrorKind::DroppedStream,
                format!("unparsable stream chunk ({e}): {data:.200}"),
            )
        })?;
        if let Some(err) = v.get("error") {
            return Err(fail(ErrorKind::StreamError, err.to_string()));
        }
        if let Some(n) = v
            .get("usage")
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64)
        {
            rec.usage_output_tokens = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if chunk_content(&v).is_some_and(|c| !c.is_empty()) {
            match *last_content {
                None => rec.ttft_ms = Some(now.duration_since(start).as_secs_f64() * 1e3),
                Some(prev) => rec
                    .chunk_gaps_ms
                    .push(now.duration_since(prev).as_secs_f64() * 1e3),
            }
            *last_content = Some(now);
            rec.content_chunks += 1;
        }
    }
    Ok(false)
}

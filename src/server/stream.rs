//! The SSE body of a streaming request: `data: {chunk}` per batch of ready text, the finish
//! reason, an optional usage chunk, then `data: [DONE]`; a failure or timeout sends an error
//! object before `[DONE]`.
//!
//! The stream owns the request's [`Output`]: when the client disconnects, axum drops the
//! body, the submission's cancel guard fires, and the engine releases the request.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::Value;

use crate::metrics as m;

use super::error::ApiError;
use super::latency::RecordedRequest;
use super::output::{timeout_message, End, Output};
use super::response::{ResponseMeta, Usage};

/// Everything a response needs besides the output.
pub struct StreamSetup {
    pub meta: ResponseMeta,
    pub record: RecordedRequest,
    pub prompt_tokens: u64,
    pub include_usage: bool,
    pub continuous_usage: bool,
}

impl StreamSetup {
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.record.tokens(),
        }
    }
}

pub fn sse_response(output: Output, setup: StreamSetup) -> Response {
    Sse::new(events(output, setup)).into_response()
}

struct Live {
    output: Output,
    setup: StreamSetup,
    sent_first: bool,
}

struct State {
    live: Option<Box<Live>>,
    pending: VecDeque<Event>,
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

fn events(output: Output, setup: StreamSetup) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = State {
        live: Some(Box::new(Live {
            output,
            setup,
            sent_first: false,
        })),
        pending: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.pending.pop_front() {
                return Some((Ok(event), state));
            }
            let mut live = state.live.take()?;
            let finished = live.pull(&mut state.pending).await;
            if !finished {
                state.live = Some(live);
            }
        }
    })
}

impl Live {
    /// Turns the next piece of output into SSE events. Returns true when the request ended
    /// (and `[DONE]` is queued).
    async fn pull(&mut self, out: &mut VecDeque<Event>) -> bool {
        let Some(piece) = self.output.next().await else {
            out.push_back(Event::default().data("[DONE]"));
            return true;
        };
        self.setup.record.on_tokens(piece.tokens);
        let finish_reason = match &piece.end {
            Some(End::Finished(reason)) => Some(*reason),
            _ => None,
        };
        if !piece.text.is_empty() || finish_reason.is_some() {
            let usage = self.setup.continuous_usage.then(|| self.setup.usage());
            let first = !self.sent_first;
            out.push_back(data(&self.setup.meta.chunk(
                &piece.text,
                first,
                finish_reason,
                usage,
            )));
            self.sent_first = true;
        }
        match piece.end {
            None => return false,
            Some(End::Finished(reason)) => {
                self.setup.record.on_finish(reason);
                if self.setup.include_usage {
                    out.push_back(data(&self.setup.meta.usage_chunk(self.setup.usage())));
                }
            }
            Some(End::Failed(message)) => {
                self.setup.record.on_fail(m::FAILED_ENGINE);
                out.push_back(data(&ApiError::engine_failed(message).body()));
            }
            Some(End::TimedOut(after)) => {
                self.setup.record.on_fail(m::FAILED_TIMEOUT);
                out.push_back(data(&ApiError::timed_out(timeout_message(after)).body()));
            }
        }
        out.push_back(Event::default().data("[DONE]"));
        true
    }
}

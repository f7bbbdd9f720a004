//! The SSE body of a streaming request: `data: {chunk}` per batch of ready tokens, the finish
//! reason, an optional usage chunk, then `data: [DONE]`.
//!
//! The stream owns the [`Submission`]: when the client disconnects, axum drops the body, the
//! submission's cancel guard fires, and the engine releases the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::Value;

use super::engine::{EngineEvent, Submission};
use super::error::ApiError;
use super::latency::RecordedRequest;
use super::response::{ResponseMeta, Usage};
use super::tokenize::Tokenizer;

/// Everything a streaming response needs besides the submission.
pub struct StreamSetup {
    pub meta: ResponseMeta,
    pub tokenizer: Arc<dyn Tokenizer>,
    pub record: RecordedRequest,
    pub prompt_tokens: u64,
    pub include_usage: bool,
    pub continuous_usage: bool,
}

pub fn sse_response(submission: Submission, setup: StreamSetup) -> Response {
    Sse::new(events(submission, setup)).into_response()
}

struct Live {
    submission: Submission,
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

fn events(
    submission: Submission,
    setup: StreamSetup,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = State {
        live: Some(Box::new(Live {
            submission,
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

enum Terminal {
    Finished(&'static str),
    Failed(String),
}

impl Live {
    /// Waits for the next event, takes every event already queued behind it, and turns them
    /// into SSE events. Returns true when the request ended (and `[DONE]` is queued).
    async fn pull(&mut self, out: &mut VecDeque<Event>) -> bool {
        let mut text = String::new();
        let mut tokens = 0u64;
        let mut terminal = None;
        let mut next = self.submission.recv().await;
        loop {
            match next {
                Some(EngineEvent::Token { id }) => {
                    text.push_str(&self.setup.tokenizer.decode_token(id));
                    tokens += 1;
                }
                Some(EngineEvent::Finished { reason }) => {
                    terminal = Some(Terminal::Finished(reason.as_openai()));
                    break;
                }
                Some(EngineEvent::Failed { message }) => {
                    terminal = Some(Terminal::Failed(message));
                    break;
                }
                None => {
                    terminal = Some(Terminal::Failed(
                        "the engine dropped the request without finishing it".into(),
                    ));
                    break;
                }
            }
            // Coalesce what is already here (e.g. speculative tokens, or a slow client);
            // never wait for more.
            match self.submission.try_recv() {
                Ok(event) => next = Some(event),
                Err(_) => break,
            }
        }
        self.setup.record.on_tokens(tokens);
        let finish_reason = match &terminal {
            Some(Terminal::Finished(reason)) => Some(*reason),
            _ => None,
        };
        if tokens > 0 || finish_reason.is_some() {
            let usage = self.setup.continuous_usage.then(|| self.usage());
            let first = !self.sent_first;
            out.push_back(data(&self.setup.meta.chunk(
                &text,
                first,
                finish_reason,
                usage,
            )));
            self.sent_first = true;
        }
        match terminal {
            None => return false,
            Some(Terminal::Finished(reason)) => {
                self.setup.record.on_finish(reason);
                if self.setup.include_usage {
                    out.push_back(data(&self.setup.meta.usage_chunk(self.usage())));
                }
            }
            Some(Terminal::Failed(message)) => {
                self.setup.record.on_fail();
                out.push_back(data(&ApiError::engine_failed(message).body()));
            }
        }
        out.push_back(Event::default().data("[DONE]"));
        true
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.setup.prompt_tokens,
            completion_tokens: self.setup.record.tokens(),
        }
    }
}

//! A request's output as the client gets it, shared by the streaming and the whole-answer
//! paths so the two always agree: the engine's tokens detokenized, cut at the first `stop`
//! string, bounded by `server.request_timeout_s`. Ending early (a stop string, the timeout)
//! drops the submission, which cancels the request at the engine and returns its slot and
//! leases.

use std::sync::Arc;
use std::time::Duration;

use super::engine::{EngineEvent, Submission};
use super::stop::StopMatcher;
use super::tokenize::Tokenizer;

/// How a request's output ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// With an OpenAI `finish_reason`.
    Finished(&'static str),
    Failed(String),
    /// Still unfinished when its time ran out.
    TimedOut(Duration),
}

/// What became ready at once: text to send, tokens it came from, and the end if reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Piece {
    pub text: String,
    /// Engine tokens this piece accounts for (held-back text included).
    pub tokens: u64,
    pub end: Option<End>,
}

pub struct Output {
    id: u64,
    /// `None` once the output ended (dropping it cancels an unfinished request).
    submission: Option<Submission>,
    tokenizer: Arc<dyn Tokenizer>,
    stop: StopMatcher,
    /// Stop strings are looked for only in the text of tokens after the first `min_tokens`.
    min_tokens: u32,
    tokens: u64,
    /// Fires at the request's deadline; one timer for the whole request.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// The message of a request that ran past `server.request_timeout_s`.
pub fn timeout_message(timeout: Duration) -> String {
    format!(
        "the request did not finish within {} s (server.request_timeout_s); it was stopped",
        timeout.as_secs_f64()
    )
}

impl Output {
    pub fn new(
        submission: Submission,
        tokenizer: Arc<dyn Tokenizer>,
        stop: Vec<String>,
        min_tokens: u32,
        timeout: Duration,
    ) -> Self {
        let now = tokio::time::Instant::now();
        Output {
            id: submission.id,
            submission: Some(submission),
            tokenizer,
            stop: StopMatcher::new(stop),
            min_tokens,
            tokens: 0,
            // A deadline past what the clock holds means none.
            deadline: Box::pin(tokio::time::sleep_until(
                now.checked_add(timeout)
                    .unwrap_or_else(|| now + Duration::from_secs(1 << 32)),
            )),
            timeout,
        }
    }

    /// The engine's id of the request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for the next event, takes every event already queued behind it (e.g.
    /// speculative tokens, or a slow client), and returns what they give; `None` after the
    /// end.
    pub async fn next(&mut self) -> Option<Piece> {
        let sub = self.submission.as_mut()?;
        let first = tokio::select! {
            event = sub.recv() => event,
            _ = self.deadline.as_mut() => {
                self.submission = None;
                return Some(Piece {
                    end: Some(End::TimedOut(self.timeout)),
                    ..Piece::default()
                });
            }
        };
        let mut piece = Piece::default();
        let mut next = first;
        loop {
            match next {
                Some(EngineEvent::Token { id }) => {
                    self.tokens += 1;
                    piece.tokens += 1;
                    let text = self.tokenizer.decode_token(id);
                    if self.tokens <= u64::from(self.min_tokens) {
                        piece.text.push_str(&text);
                    } else {
                        let released = self.stop.push(&text);
                        piece.text.push_str(&released.text);
                        if released.stopped {
                            piece.end = Some(End::Finished("stop"));
                            break;
                        }
                    }
                }
                Some(EngineEvent::Finished { reason }) => {
                    piece.text.push_str(&self.stop.finish());
                    piece.end = Some(End::Finished(reason.as_openai()));
                    break;
                }
                Some(EngineEvent::Failed { message }) => {
                    piece.text.push_str(&self.stop.finish());
                    piece.end = Some(End::Failed(message));
                    break;
                }
                None => {
                    piece.end = Some(End::Failed(
                        "the engine dropped the request without finishing it".into(),
                    ));
                    break;
                }
            }
            match sub.try_recv() {
                Ok(event) => next = Some(event),
                Err(_) => break,
            }
        }
        if piece.end.is_some() {
            // Ended here by a stop string: the request is cancelled at the engine.
            self.submission = None;
        }
        Some(piece)
    }
}

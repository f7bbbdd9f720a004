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

/// A token's text, joined across tokens where one character's bytes span several (byte-level
/// BPE): a token whose own text is not whole (it holds U+FFFD) is held with the tokens after
/// it until their text together is.
#[derive(Debug, Default)]
pub struct Detokenizer {
    held: Vec<u32>,
}

/// Tokens held at most before their text is sent as it is (a model may emit U+FFFD itself).
const MAX_HELD_TOKENS: usize = 8;

impl Detokenizer {
    /// The text `id` completes (often empty while a character is still incomplete).
    pub fn push(&mut self, tokenizer: &dyn Tokenizer, id: u32) -> String {
        if self.held.is_empty() {
            let text = tokenizer.decode_token(id);
            if !text.contains(char::REPLACEMENT_CHARACTER) {
                return text;
            }
        }
        self.held.push(id);
        let text = tokenizer.decode(&self.held);
        if text.ends_with(char::REPLACEMENT_CHARACTER) && self.held.len() < MAX_HELD_TOKENS {
            return String::new();
        }
        self.held.clear();
        text
    }

    /// The output ended: whatever is held, as it decodes.
    pub fn finish(&mut self, tokenizer: &dyn Tokenizer) -> String {
        let text = if self.held.is_empty() {
            String::new()
        } else {
            tokenizer.decode(&self.held)
        };
        self.held.clear();
        text
    }
}

pub struct Output {
    id: u64,
    detok: Detokenizer,
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

/// Passes `text` through the stop strings (only once `armed`, i.e. past `min_tokens`) into
/// `out`; true when a stop string ended the output.
fn release(stop: &mut StopMatcher, armed: bool, text: &str, out: &mut String) -> bool {
    if !armed {
        out.push_str(text);
        return false;
    }
    let released = stop.push(text);
    out.push_str(&released.text);
    released.stopped
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
            detok: Detokenizer::default(),
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
                    let text = self.detok.push(self.tokenizer.as_ref(), id);
                    let armed = self.tokens > u64::from(self.min_tokens);
                    if release(&mut self.stop, armed, &text, &mut piece.text) {
                        piece.end = Some(End::Finished("stop"));
                        break;
                    }
                }
                Some(EngineEvent::Finished { reason }) => {
                    let rest = self.detok.finish(self.tokenizer.as_ref());
                    let armed = self.tokens > u64::from(self.min_tokens);
                    let reason = if release(&mut self.stop, armed, &rest, &mut piece.text) {
                        "stop"
                    } else {
                        piece.text.push_str(&self.stop.finish());
                        reason.as_openai()
                    };
                    piece.end = Some(End::Finished(reason));
                    break;
                }
                Some(EngineEvent::Failed { message }) => {
                    let rest = self.detok.finish(self.tokenizer.as_ref());
                    piece.text.push_str(&self.stop.finish());
                    piece.text.push_str(&rest);
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

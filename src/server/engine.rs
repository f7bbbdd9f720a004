//! The seam between the HTTP front end and whatever generates tokens (the actor runtime, or
//! the mock in tests). The server only ever sees this trait.

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::sampling::SamplingParams;

/// A validated generation request, already tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub prompt_tokens: Vec<u32>,
    /// Upper bound on output tokens; always ≥ 1.
    pub max_tokens: u32,
    /// EOS is suppressed until this many tokens were produced; always ≤ `max_tokens`.
    pub min_tokens: u32,
    pub ignore_eos: bool,
    /// Upstream arrival (unix seconds) from the router or client; `None` means "now".
    pub arrival_unix_s: Option<f64>,
    /// How the backend picks each token.
    pub sampling: SamplingParams,
    /// Stop strings: the HTTP layer ends the output at the first one in the text and
    /// cancels the request (engines need not look at them).
    pub stop: Vec<String>,
}

/// What the engine reports for one request, in order: tokens, then exactly one terminal event.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    Token { id: u32 },
    Finished { reason: FinishReason },
    Failed { message: String },
}

impl EngineEvent {
    pub fn is_terminal(&self) -> bool {
        !matches!(self, EngineEvent::Token { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// EOS produced (after `min_tokens`, and only without `ignore_eos`).
    Stop,
    /// Ended by the engine (shutdown drain limit, operator action) before Length or Stop.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string; "abort" follows vLLM for engine-side cancellation.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Cancelled => "abort",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the waiting queue is full ({max_waiting} requests); retry later")]
    QueueFull { max_waiting: usize },
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Invalid(String),
}

/// Calls the engine's cancel for a request unless the request reached a terminal event.
struct CancelGuard {
    id: u64,
    cancel: Option<Box<dyn FnOnce(u64) + Send + Sync>>,
}

impl CancelGuard {
    fn disarm(&mut self) {
        self.cancel = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel(self.id);
        }
    }
}

impl std::fmt::Debug for CancelGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelGuard")
            .field("id", &self.id)
            .field("armed", &self.cancel.is_some())
            .finish()
    }
}

/// A submitted request. Dropping it before a terminal event cancels the request, which is how
/// a client disconnect releases every lease the request holds.
///
/// Read events through [`Submission::recv`] / [`Submission::try_recv`]: they disarm the cancel
/// guard when the terminal event arrives. Code that reads `events` directly must call
/// [`Submission::mark_finished`] itself.
#[derive(Debug)]
pub struct Submission {
    pub id: u64,
    pub events: UnboundedReceiver<EngineEvent>,
    guard: CancelGuard,
}

impl Submission {
    /// `cancel` runs at most once, with `id`, if this is dropped before a terminal event.
    /// Engines must treat a cancel of an already finished id as a no-op.
    pub fn new(
        id: u64,
        events: UnboundedReceiver<EngineEvent>,
        cancel: impl FnOnce(u64) + Send + Sync + 'static,
    ) -> Self {
        Submission {
            id,
            events,
            guard: CancelGuard {
                id,
                cancel: Some(Box::new(cancel)),
            },
        }
    }

    /// The next event; `None` when the engine dropped the sender (treated as a failure).
    pub async fn recv(&mut self) -> Option<EngineEvent> {
        let event = self.events.recv().await;
        self.note(event.as_ref());
        event
    }

    /// The next event if one is ready now.
    pub fn try_recv(&mut self) -> Result<EngineEvent, TryRecvError> {
        let event = self.events.try_recv();
        self.note(event.as_ref().ok());
        event
    }

    /// The request ended; dropping the submission no longer cancels it.
    pub fn mark_finished(&mut self) {
        self.guard.disarm();
    }

    fn note(&mut self, event: Option<&EngineEvent>) {
        if event.is_some_and(EngineEvent::is_terminal) {
            self.mark_finished();
        }
    }
}

/// The engine behind the HTTP server.
pub trait Engine: Send + Sync + 'static {
    /// Queue a request. Must not block: admission happens later, in the engine.
    fn submit(&self, req: GenRequest) -> Result<Submission, SubmitError>;
    /// Stop a request and release everything it holds. A no-op for unknown or finished ids.
    fn cancel(&self, id: u64);
    /// Every component's state as JSON, for `GET /debug/actors`.
    fn debug_state(&self) -> BoxFuture<'static, serde_json::Value>;
    /// Longest prompt + output the engine accepts.
    fn max_context_tokens(&self) -> usize;
    /// Refuse new requests, let the in-flight ones (queued included) finish for up to
    /// `drain`, then fail the rest with a clear message; resolves once every request has its
    /// terminal event.
    fn shutdown(&self, drain: Duration) -> BoxFuture<'static, ()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The success counter is registered at zero for these labels: every finish reason is one.
    #[test]
    fn every_finish_reason_is_a_label_the_success_counter_starts_with() {
        for r in [
            FinishReason::Length,
            FinishReason::Stop,
            FinishReason::Cancelled,
        ] {
            assert!(crate::metrics::FINISHED_REASONS.contains(&r.as_openai()));
        }
    }

    fn counting_submission() -> (
        Submission,
        tokio::sync::mpsc::UnboundedSender<EngineEvent>,
        Arc<AtomicUsize>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancels = Arc::new(AtomicUsize::new(0));
        let c = cancels.clone();
        let sub = Submission::new(7, rx, move |id| {
            assert_eq!(id, 7);
            c.fetch_add(1, Ordering::SeqCst);
        });
        (sub, tx, cancels)
    }

    #[test]
    fn dropping_an_unfinished_submission_cancels_it_once() {
        let (mut sub, tx, cancels) = counting_submission();
        tx.send(EngineEvent::Token { id: 1 }).ok();
        assert_eq!(sub.try_recv(), Ok(EngineEvent::Token { id: 1 }));
        drop(sub);
        assert_eq!(cancels.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_terminal_event_disarms_the_cancel() {
        for terminal in [
            EngineEvent::Finished {
                reason: FinishReason::Length,
            },
            EngineEvent::Failed {
                message: "x".into(),
            },
        ] {
            let (mut sub, tx, cancels) = counting_submission();
            tx.send(terminal.clone()).ok();
            assert_eq!(sub.try_recv(), Ok(terminal));
            drop(sub);
            assert_eq!(cancels.load(Ordering::SeqCst), 0);
        }
    }
}

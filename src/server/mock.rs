//! An in-process engine that emits tokens at a fixed pace: the server's test double, and a
//! backend-free way to load-test the HTTP layer. It counts live requests and cancellations so
//! tests can check that every request is released.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::json;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

use super::engine::{Engine, EngineEvent, FinishReason, GenRequest, Submission, SubmitError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MockShutdown {
    /// Let in-flight requests run for the drain window, then fail the rest.
    Drain,
    /// End every in-flight request with `Failed` at once.
    Fail,
}

#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Time before each token, the first included.
    pub token_interval: Duration,
    /// Requests in flight beyond this are refused with `QueueFull`.
    pub max_live: usize,
    pub max_context_tokens: usize,
    /// Emit EOS (finish `Stop`) after this many tokens, unless `ignore_eos`; never before
    /// `min_tokens`.
    pub eos_after: Option<u32>,
    pub shutdown: MockShutdown,
    /// Token ids every request emits in order (cycling); empty: ids distinct per request
    /// and position.
    pub script: Vec<u32>,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            token_interval: Duration::from_millis(1),
            max_live: 1024,
            max_context_tokens: 8192,
            eos_after: None,
            shutdown: MockShutdown::Drain,
            script: Vec::new(),
        }
    }
}

/// The shutdown failure message, for tests to match.
pub const SHUTDOWN_MESSAGE: &str = "the server is shutting down; request not completed";

#[derive(Default)]
struct Control {
    stop: Notify,
    fail: AtomicBool,
}

struct Inner {
    cfg: MockConfig,
    /// While true, no request emits its next token (lets tests freeze the engine).
    hold: tokio::sync::watch::Sender<bool>,
    next_id: AtomicU64,
    live: Mutex<BTreeMap<u64, Arc<Control>>>,
    cancelled: Mutex<Vec<u64>>,
    submitted: Mutex<Vec<GenRequest>>,
    shutting_down: AtomicBool,
}

/// Locks ignoring poison: a panicking test thread must not hide the state from the others.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl Inner {
    fn cancel(&self, id: u64) {
        let control = lock(&self.live).get(&id).cloned();
        if let Some(control) = control {
            lock(&self.cancelled).push(id);
            control.stop.notify_one();
        }
    }
}

#[derive(Clone)]
pub struct MockEngine {
    inner: Arc<Inner>,
}

impl MockEngine {
    pub fn new(cfg: MockConfig) -> Self {
        MockEngine {
            inner: Arc::new(Inner {
                cfg,
                hold: tokio::sync::watch::Sender::new(false),
                next_id: AtomicU64::new(1),
                live: Mutex::new(BTreeMap::new()),
                cancelled: Mutex::new(Vec::new()),
                submitted: Mutex::new(Vec::new()),
                shutting_down: AtomicBool::new(false),
            }),
        }
    }

    /// Requests submitted and not yet ended.
    pub fn live(&self) -> usize {
        lock(&self.inner.live).len()
    }

    /// Ids cancelled while live, in order.
    pub fn cancelled(&self) -> Vec<u64> {
        lock(&self.inner.cancelled).clone()
    }

    /// Every accepted request, in order.
    pub fn submitted(&self) -> Vec<GenRequest> {
        lock(&self.inner.submitted).clone()
    }

    /// Freezes (true) or resumes (false) token emission of every request.
    pub fn hold(&self, held: bool) {
        self.inner.hold.send_replace(held);
    }

    /// Polls until no request is live; false if `within` passed first.
    pub async fn wait_idle(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.live() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// Tokens to emit and how the request ends.
    fn plan(cfg: &MockConfig, req: &GenRequest) -> (u32, FinishReason) {
        match cfg.eos_after {
            Some(eos) if !req.ignore_eos && eos.max(req.min_tokens) < req.max_tokens => {
                (eos.max(req.min_tokens), FinishReason::Stop)
            }
            _ => (req.max_tokens, FinishReason::Length),
        }
    }
}

async fn run(
    inner: Arc<Inner>,
    id: u64,
    req: GenRequest,
    tx: UnboundedSender<EngineEvent>,
    control: Arc<Control>,
) {
    let (count, reason) = MockEngine::plan(&inner.cfg, &req);
    let mut end = Some(EngineEvent::Finished { reason });
    let mut hold = inner.hold.subscribe();
    for i in 0..count {
        let pace = async {
            tokio::time::sleep(inner.cfg.token_interval).await;
            // Err only if the sender is gone, which `inner` (alive here) rules out.
            let _ = hold.wait_for(|held| !held).await;
        };
        tokio::select! {
            _ = pace => {}
            _ = control.stop.notified() => {
                end = control.fail.load(Ordering::SeqCst).then(|| EngineEvent::Failed {
                    message: SHUTDOWN_MESSAGE.into(),
                });
                break;
            }
        }
        let script = &inner.cfg.script;
        let token = if script.is_empty() {
            // Arbitrary but distinct per request and position.
            (id as u32).wrapping_mul(7919).wrapping_add(i)
        } else {
            script[i as usize % script.len()]
        };
        if tx.send(EngineEvent::Token { id: token }).is_err() {
            end = None;
            break;
        }
    }
    if let Some(end) = end {
        // The receiver may be gone; then nobody is waiting for the end.
        let _ = tx.send(end);
    }
    lock(&inner.live).remove(&id);
}

impl Engine for MockEngine {
    fn submit(&self, req: GenRequest) -> Result<Submission, SubmitError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(SubmitError::Unavailable("shutting down".into()));
        }
        if req.prompt_tokens.len() + req.max_tokens as usize > self.inner.cfg.max_context_tokens {
            return Err(SubmitError::Invalid(
                "prompt + max_tokens exceed the context".into(),
            ));
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::SeqCst);
        let control = Arc::new(Control::default());
        {
            let mut live = lock(&self.inner.live);
            if live.len() >= self.inner.cfg.max_live {
                return Err(SubmitError::QueueFull {
                    max_waiting: self.inner.cfg.max_live,
                });
            }
            live.insert(id, control.clone());
        }
        lock(&self.inner.submitted).push(req.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(run(self.inner.clone(), id, req, tx, control));
        let inner = self.inner.clone();
        Ok(Submission::new(id, rx, move |id| inner.cancel(id)))
    }

    fn cancel(&self, id: u64) {
        self.inner.cancel(id);
    }

    fn debug_state(&self) -> BoxFuture<'static, serde_json::Value> {
        let state = json!({
            "engine": "mock",
            "live": self.live(),
            "cancelled": self.cancelled().len(),
            "submitted": lock(&self.inner.submitted).len(),
            "shutting_down": self.inner.shutting_down.load(Ordering::SeqCst),
        });
        async move { state }.boxed()
    }

    fn max_context_tokens(&self) -> usize {
        self.inner.cfg.max_context_tokens
    }

    fn shutdown(&self, drain: Duration) -> BoxFuture<'static, ()> {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let engine = self.clone();
        async move {
            let drain = match engine.inner.cfg.shutdown {
                MockShutdown::Drain => drain,
                MockShutdown::Fail => Duration::ZERO,
            };
            if !engine.wait_idle(drain).await {
                for control in lock(&engine.inner.live).values() {
                    control.fail.store(true, Ordering::SeqCst);
                    control.stop.notify_one();
                }
                // Every live request was just told to fail.
                while !engine.wait_idle(Duration::from_secs(3600)).await {}
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(max_tokens: u32, min_tokens: u32, ignore_eos: bool) -> GenRequest {
        GenRequest {
            prompt_tokens: vec![1, 2, 3],
            max_tokens,
            min_tokens,
            ignore_eos,
            arrival_unix_s: None,
            sampling: Default::default(),
            stop: Vec::new(),
        }
    }

    #[test]
    fn eos_respects_min_tokens_ignore_eos_and_max_tokens() {
        let cfg = MockConfig {
            eos_after: Some(4),
            ..MockConfig::default()
        };
        let plan = |r| MockEngine::plan(&cfg, &r);
        assert_eq!(plan(req(10, 0, false)), (4, FinishReason::Stop));
        assert_eq!(plan(req(10, 6, false)), (6, FinishReason::Stop));
        assert_eq!(plan(req(10, 0, true)), (10, FinishReason::Length));
        assert_eq!(plan(req(3, 0, false)), (3, FinishReason::Length));
    }

    #[tokio::test]
    async fn a_request_streams_its_tokens_then_finishes_and_leaves() {
        let engine = MockEngine::new(MockConfig::default());
        let mut sub = engine.submit(req(5, 0, true)).unwrap();
        let mut tokens = 0;
        loop {
            match sub.recv().await {
                Some(EngineEvent::Token { .. }) => tokens += 1,
                Some(end) => {
                    assert_eq!(
                        end,
                        EngineEvent::Finished {
                            reason: FinishReason::Length
                        }
                    );
                    break;
                }
                None => panic!("channel closed before the end"),
            }
        }
        assert_eq!(tokens, 5);
        assert!(engine.wait_idle(Duration::from_secs(5)).await);
        drop(sub);
        assert!(engine.cancelled().is_empty());
    }
}

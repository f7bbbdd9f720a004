//! SPEC §4.6: a request's first token is emitted when the request is first scheduled. A
//! backend that has it at the context's arrival (a prefill, the timing model) lets the
//! client see it as the first step starts; one whose first step computes it (a KV
//! transfer) sends it with that step. Either way each token reaches the client once.

mod serve_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use genslot::actors::{ActorEngine, StartOptions};
use genslot::gpu::{
    Arrived, BackendCapacity, BackendError, ContextArrival, StepBackend, StepOutput, StepRow,
};
use genslot::ids::RequestId;
use genslot::server::engine::{Engine, FinishReason, GenRequest};
use genslot::timing::{Clock, RealClock};
use serve_support::*;

/// The token at position p of every request is `FIRST + p`. Like the timing model, the
/// first step returns the first token and the step's own; later steps one each.
struct Scripted {
    first_at_arrival: bool,
    step: Duration,
    emitted: std::collections::BTreeMap<RequestId, u32>,
}

const FIRST: u32 = 100;

impl Scripted {
    fn new(first_at_arrival: bool, step: Duration) -> Self {
        Scripted {
            first_at_arrival,
            step,
            emitted: Default::default(),
        }
    }
}

impl StepBackend for Scripted {
    fn context_arrival(&mut self, _: &ContextArrival) -> Result<Arrived, BackendError> {
        Ok(Arrived {
            seconds: 0.0,
            first_token: self.first_at_arrival.then_some(FIRST),
        })
    }
    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError> {
        std::thread::sleep(self.step);
        let tokens = rows
            .iter()
            .map(|r| {
                let done = self.emitted.entry(r.id).or_default();
                let n = if *done == 0 { 2 } else { 1 };
                let out = (*done..*done + n).map(|p| FIRST + p).collect();
                *done += n;
                out
            })
            .collect();
        Ok(StepOutput {
            tokens,
            step_s: self.step.as_secs_f64(),
        })
    }
    fn release(&mut self, id: RequestId) {
        self.emitted.remove(&id);
    }
    fn capacity(&self) -> BackendCapacity {
        BackendCapacity {
            kv_pages: 1 << 16,
            tokens_per_block: 32,
            seq_slots: 8,
        }
    }
}

fn start(backend: Scripted, eos_token: Option<u32>) -> ActorEngine {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let options = StartOptions {
        eos_token,
        ..StartOptions::default()
    };
    ActorEngine::start(&config(""), Box::new(backend), clock, options).expect("start")
}

fn request(max_tokens: u32, ignore_eos: bool) -> GenRequest {
    GenRequest {
        prompt_tokens: vec![1, 2, 3],
        max_tokens,
        min_tokens: 0,
        ignore_eos,
        arrival_unix_s: None,
        sampling: Default::default(),
        stop: Vec::new(),
    }
}

/// Every token the request streams with when it reached the test, and how it ended.
async fn run(engine: &ActorEngine, req: GenRequest) -> (Vec<(u32, Instant)>, FinishReason) {
    stream_to_end(engine.submit(req).expect("accepted")).await
}

fn ids(tokens: &[(u32, Instant)]) -> Vec<u32> {
    tokens.iter().map(|(t, _)| *t).collect()
}

#[tokio::test]
async fn a_first_token_known_at_arrival_reaches_the_client_a_whole_step_before_the_second() {
    let step = Duration::from_millis(300);
    let engine = start(Scripted::new(true, step), None);
    let (tokens, reason) = run(&engine, request(3, true)).await;
    assert_eq!(ids(&tokens), [FIRST, FIRST + 1, FIRST + 2]);
    assert_eq!(reason, FinishReason::Length);
    // Sent as the first step began; the second token comes back with that step. (Before,
    // both came together, after the step.)
    let gap = tokens[1].1 - tokens[0].1;
    assert!(gap >= step * 2 / 3, "first-to-second token gap {gap:?}");
}

/// Each of `max_tokens` tokens reaches the client once, in order, whichever way the first
/// one comes.
async fn each_token_arrives_once(first_at_arrival: bool) {
    let engine = start(
        Scripted::new(first_at_arrival, Duration::from_millis(2)),
        None,
    );
    for max_tokens in [1, 2, 5] {
        let (tokens, reason) = run(&engine, request(max_tokens, true)).await;
        let want: Vec<u32> = (0..max_tokens).map(|p| FIRST + p).collect();
        assert_eq!(ids(&tokens), want, "max_tokens {max_tokens}");
        assert_eq!(reason, FinishReason::Length);
    }
}

#[tokio::test]
async fn a_first_token_the_first_step_computes_is_sent_with_that_step_and_once() {
    each_token_arrives_once(false).await;
}

#[tokio::test]
async fn a_first_token_sent_early_is_not_sent_again_with_the_first_steps_tokens() {
    each_token_arrives_once(true).await;
}

#[tokio::test]
async fn an_eos_first_token_given_at_arrival_stops_the_request_before_any_token() {
    let engine = start(Scripted::new(true, Duration::from_millis(2)), Some(FIRST));
    let (tokens, reason) = run(&engine, request(5, false)).await;
    assert!(tokens.is_empty(), "streamed {:?}", ids(&tokens));
    assert_eq!(reason, FinishReason::Stop);
    // With ignore_eos it is an ordinary token.
    let (tokens, reason) = run(&engine, request(3, true)).await;
    assert_eq!(ids(&tokens), [FIRST, FIRST + 1, FIRST + 2]);
    assert_eq!(reason, FinishReason::Length);
}

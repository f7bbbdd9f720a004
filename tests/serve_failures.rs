//! A failing GPU-step actor never hangs a request: a step that errors fails the requests
//! of its batch with the backend's reason (and the supervisor turns preemption off); a
//! backend thread that panics fails every in-flight request and new ones get HTTP 503; a step
//! that hangs on the device shows in `/debug/actors` with how long it has run.

mod serve_support;

use std::sync::Arc;

use genslot::actors::{ActorEngine, StartOptions};
use genslot::gpu::{
    Arrived, BackendCapacity, BackendError, ContextArrival, StepBackend, StepOutput, StepRow,
};
use genslot::ids::RequestId;
use genslot::server::engine::{Engine, EngineEvent, GenRequest};
use genslot::timing::{Clock, RealClock};
use serde_json::json;
use serve_support::*;

/// Context arrives at once; every step fails, or panics.
struct Broken {
    panic: bool,
}

impl StepBackend for Broken {
    fn context_arrival(&mut self, _: &ContextArrival) -> Result<Arrived, BackendError> {
        Ok(Arrived {
            seconds: 0.0,
            first_token: None,
        })
    }
    fn step(&mut self, _: &[StepRow]) -> Result<StepOutput, BackendError> {
        if self.panic {
            panic!("device lost");
        }
        Err(BackendError::Failed("illegal memory access".into()))
    }
    fn release(&mut self, _: RequestId) {}
    fn capacity(&self) -> BackendCapacity {
        BackendCapacity {
            kv_pages: 1 << 20,
            tokens_per_block: 32,
            seq_slots: 256,
        }
    }
}

/// Every step blocks until the test lets go (drops the sender), then fails.
struct Hanging {
    release: std::sync::mpsc::Receiver<()>,
}

impl StepBackend for Hanging {
    fn context_arrival(&mut self, _: &ContextArrival) -> Result<Arrived, BackendError> {
        Ok(Arrived {
            seconds: 0.0,
            first_token: None,
        })
    }
    fn step(&mut self, _: &[StepRow]) -> Result<StepOutput, BackendError> {
        let _ = self.release.recv();
        Err(BackendError::Failed("released".into()))
    }
    fn release(&mut self, _: RequestId) {}
    fn capacity(&self) -> BackendCapacity {
        Broken { panic: false }.capacity()
    }
}

fn broken(panic: bool) -> ActorEngine {
    let cfg = config("scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }\n");
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    ActorEngine::start(
        &cfg,
        Box::new(Broken { panic }),
        clock,
        StartOptions::default(),
    )
    .unwrap()
}

fn request() -> GenRequest {
    GenRequest {
        prompt_tokens: vec![1, 2, 3],
        max_tokens: 10,
        min_tokens: 0,
        ignore_eos: true,
        arrival_unix_s: None,
        sampling: Default::default(),
        stop: Vec::new(),
    }
}

async fn terminal(engine: &ActorEngine) -> EngineEvent {
    let mut sub = engine.submit(request()).unwrap();
    tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("the request ends")
        .expect("an event")
}

#[tokio::test]
async fn a_failing_step_fails_its_batch_with_the_reason_and_disables_preemption() {
    let engine = broken(false);
    match terminal(&engine).await {
        EngineEvent::Failed { message } => {
            assert!(message.contains("illegal memory access"), "{message}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    let st = engine.supervisor_state().await.unwrap();
    assert!(!st.enabled);
    assert!(st.warning.unwrap().contains("decode step failed"));
    // Every lease of the failed request comes back.
    let s = Server::with_engine(engine).await;
    let mut used = s.pools_used().await;
    for _ in 0..100 {
        if used.iter().all(|(_, u)| *u == 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        used = s.pools_used().await;
    }
    assert!(used.iter().all(|(_, u)| *u == 0), "{used:?}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_panicking_backend_fails_in_flight_requests_and_refuses_new_ones_with_503() {
    let engine = broken(true);
    match terminal(&engine).await {
        EngineEvent::Failed { message } => assert!(message.contains("device lost"), "{message}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    let s = Server::with_engine(engine).await;
    let r = s
        .post("/v1/completions", &json!({"prompt": "a", "max_tokens": 3}))
        .await;
    assert_eq!(r.status(), 503);
    let d = s.debug().await;
    assert!(d["executor"]["backend_down"]
        .as_str()
        .unwrap()
        .contains("panicked"));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_component_actor_that_stops_fails_in_flight_requests_and_new_ones_get_503() {
    let cfg = config("scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }\n");
    let engine = engine(&cfg);
    let mut sub = engine
        .submit(GenRequest {
            max_tokens: 5000,
            ..request()
        })
        .unwrap();
    // Streaming: the request is resident and the passes are running.
    match tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("a token")
    {
        Some(EngineEvent::Token { .. }) => {}
        other => panic!("expected a token, got {other:?}"),
    }
    assert!(engine.halt_component("kv_pool"));
    assert!(!engine.halt_component("no_such_component"));
    let message = loop {
        match tokio::time::timeout(WAIT, sub.recv())
            .await
            .expect("the request ends")
        {
            Some(EngineEvent::Token { .. }) => continue,
            Some(EngineEvent::Failed { message }) => break message,
            other => panic!("expected a failure, got {other:?}"),
        }
    };
    assert!(message.contains("kv_pool actor stopped"), "{message}");
    let st = engine.supervisor_state().await.unwrap();
    assert!(!st.enabled, "the supervisor turned preemption off");
    let s = Server::with_engine(engine).await;
    let r = s
        .post("/v1/completions", &json!({"prompt": "a", "max_tokens": 3}))
        .await;
    assert_eq!(r.status(), 503);
    let d = s.debug().await;
    let kv = d["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["actor"] == "kv_pool")
        .cloned();
    assert_eq!(kv.map(|c| c["stopped"].clone()), Some(json!(true)));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_step_that_hangs_on_the_device_shows_in_debug_actors_with_how_long_it_has_run() {
    let (tx, release) = std::sync::mpsc::channel();
    let cfg = config("");
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let engine = ActorEngine::start(
        &cfg,
        Box::new(Hanging { release }),
        clock,
        StartOptions::default(),
    )
    .unwrap();
    let mut sub = engine.submit(request()).unwrap();
    let s = Server::with_engine(engine).await;
    let stepping = |d: &serde_json::Value| d["executor"]["stepping"].clone();
    let mut first = s.debug().await;
    for _ in 0..200 {
        if !stepping(&first).is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        first = s.debug().await;
    }
    assert_eq!(stepping(&first)["batch"], 1, "{first}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let later = s.debug().await;
    let (a, b) = (
        stepping(&first)["for_s"].as_f64().unwrap(),
        stepping(&later)["for_s"].as_f64().unwrap(),
    );
    // The same step, still in flight, 0.2 s older.
    assert_eq!(stepping(&later)["pass"], stepping(&first)["pass"]);
    assert!(a >= 0.0 && b >= a + 0.19, "{a} then {b}");
    drop(tx);
    match tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("the request ends")
    {
        Some(EngineEvent::Failed { message }) => assert!(message.contains("released"), "{message}"),
        other => panic!("expected the released step's failure, got {other:?}"),
    }
    s.shutdown().await.unwrap();
}

//! A backend may rely on the order of its messages: a request's sequence slot is free once
//! the backend has released the request, and the executor must tell it so before it hands
//! the slot to the next arrival. The backend here refuses an arrival into a slot that an
//! unreleased request still holds, as the CUDA backend does; with as many slots as decode
//! rows, every admission after the first wave reuses a slot a departure has just freed.

mod serve_support;

use std::collections::BTreeMap;
use std::sync::Arc;

use genslot::actors::{ActorEngine, StartOptions};
use genslot::gpu::{
    Arrived, BackendCapacity, BackendError, ContextArrival, StepBackend, StepOutput, StepRow,
};
use genslot::ids::RequestId;
use genslot::server::engine::{Engine, GenRequest};
use genslot::timing::{Clock, RealClock};
use serve_support::*;

/// Holds slot → request like a device-side state table; one token per row per step.
#[derive(Default)]
struct SlotStrict {
    holders: BTreeMap<u32, RequestId>,
}

impl StepBackend for SlotStrict {
    fn context_arrival(&mut self, req: &ContextArrival) -> Result<Arrived, BackendError> {
        if let Some(&other) = self.holders.get(&req.slot) {
            if other != req.id {
                return Err(BackendError::Failed(format!(
                    "request {}: sequence slot {} is held by request {other}",
                    req.id, req.slot
                )));
            }
        }
        self.holders.insert(req.slot, req.id);
        // The first step computes the first token, as a KV transfer's does.
        Ok(Arrived {
            seconds: 0.0,
            first_token: None,
        })
    }
    fn step(&mut self, rows: &[StepRow]) -> Result<StepOutput, BackendError> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        Ok(StepOutput {
            tokens: rows.iter().map(|_| vec![7]).collect(),
            step_s: 0.001,
        })
    }
    fn release(&mut self, id: RequestId) {
        self.holders.retain(|_, h| *h != id);
    }
    fn capacity(&self) -> BackendCapacity {
        BackendCapacity {
            kv_pages: 1 << 16,
            tokens_per_block: 32,
            seq_slots: 2,
        }
    }
}

#[tokio::test]
async fn a_departed_requests_slot_is_released_in_the_backend_before_the_next_arrival_takes_it() {
    let cfg = config("max_batch_size: 2\n");
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let engine = ActorEngine::start(
        &cfg,
        Box::new(SlotStrict::default()),
        clock,
        StartOptions::default(),
    )
    .unwrap();
    let mut subs = Vec::new();
    for i in 0..24u32 {
        let req = GenRequest {
            prompt_tokens: vec![1, 2, 3 + i],
            max_tokens: 3 + i % 4,
            min_tokens: 0,
            ignore_eos: true,
            arrival_unix_s: None,
            sampling: Default::default(),
            stop: Vec::new(),
        };
        subs.push(engine.submit(req).expect("accepted"));
    }
    for sub in subs {
        stream_to_end(sub).await;
    }
}

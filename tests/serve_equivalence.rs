//! With a virtual clock and a seeded workload, the actor system makes exactly the decisions
//! the worker core makes: every pass the executor ran (inputs and outputs recorded) replays
//! through a fresh `WorkerCore` — the simulator's engine — to identical outputs: the same
//! admissions, pauses, resumes, displacements and batches, in the same passes.

mod serve_support;

use std::sync::Arc;

use genslot::actors::{supervisor, ActorEngine, StartOptions};
use genslot::gpu::model::ModelBackend;
use genslot::server::engine::{Engine, EngineEvent, FinishReason, GenRequest};
use genslot::timing::{Clock, VirtualClock};
use genslot::worker::WorkerCore;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_system_decides_exactly_as_the_worker_core_on_the_same_inputs() {
    let cfg = config(
        "max_batch_size: 4\nkv_cache_config: { max_tokens: 64000 }\n\
         scheduler_config:\n  gen_admission: { min_samples: 5, target_window: 50 }\n  \
         gen_preemption: { tpot_budget: 0.5 }\n",
    );
    let clock = VirtualClock::new();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let backend = ModelBackend::from_config(&cfg, shared.clone());
    let engine = Arc::new(
        ActorEngine::start(
            &cfg,
            Box::new(backend),
            shared,
            StartOptions {
                record: true,
                ..StartOptions::default()
            },
        )
        .unwrap(),
    );

    // A seeded closed-loop workload: 16 lanes, 4 requests each, random sizes.
    let mut rng = SmallRng::seed_from_u64(7);
    let plan: Vec<Vec<(usize, u32)>> = (0..16)
        .map(|_| {
            (0..4)
                .map(|_| (rng.random_range(1..400), rng.random_range(80..200)))
                .collect()
        })
        .collect();
    let lanes: Vec<_> = plan
        .into_iter()
        .map(|lane| {
            let engine = engine.clone();
            tokio::spawn(async move {
                for (prompt, max_tokens) in lane {
                    let mut sub = engine
                        .submit(GenRequest {
                            prompt_tokens: vec![1; prompt],
                            max_tokens,
                            min_tokens: 0,
                            ignore_eos: true,
                            arrival_unix_s: None,
                            sampling: Default::default(),
                            stop: Vec::new(),
                        })
                        .unwrap();
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
                            None => panic!("the engine dropped a request"),
                        }
                    }
                    assert_eq!(tokens, max_tokens);
                }
            })
        })
        .collect();
    for lane in lanes {
        tokio::time::timeout(WAIT * 3, lane).await.unwrap().unwrap();
    }

    let record = engine.take_record().await;
    let (params, _) = supervisor::setup(&cfg).unwrap();
    let mut core = WorkerCore::new(params);
    let mut pauses = 0;
    for (i, (inputs, actor_out)) in record.iter().enumerate() {
        let out = core.pass(inputs);
        assert_eq!(&out, actor_out, "pass {i} differs");
        core.check_invariants(&out).unwrap();
        pauses += out.pauses.len();
    }
    assert!(record.len() > 100, "{} passes", record.len());
    assert!(pauses > 0, "the workload must exercise preemption");
    assert!(core.is_idle());
    assert!(clock.now() > 0.0);
}

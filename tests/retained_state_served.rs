//! Served under a preemption load on the f32 CPU reference backend (no GPU): 12 closed-loop
//! lanes on a batch of 4 with `tpot_budget` preemption, so the controller pauses requests and
//! forced resumes displace others. Outputs are 80 to 127 tokens: a request becomes a victim
//! only after 64 decode iterations (SPEC §4.3), so shorter ones are never paused. Every
//! request — the paused and displaced ones included —
//! answers exactly what it answers alone: with the drafter on (its window retained in the
//! drafter arena's slot while out of the batch) and with the hybrid shape (its recurrent
//! state retained in its slot).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use genslot::actors::{ActorEngine, StartOptions};
use genslot::config::Config;
use genslot::gpu::cuda::cpu_backend::CpuRefBackend;
use genslot::gpu::cuda::cpu_ref::CpuModel;
use genslot::gpu::cuda::draft::DraftConfig;
use genslot::gpu::cuda::draft_sets::synthetic;
use genslot::gpu::cuda::drive::solo;
use genslot::gpu::cuda::shape::ModelShape;
use genslot::gpu::{BackendCapacity, ContextArrival};
use genslot::sampling::SamplingParams;
use genslot::server::engine::{Engine, EngineEvent, FinishReason, GenRequest};
use genslot::timing::{Clock, RealClock};

const LANES: usize = 12;
const ROUNDS: usize = 2;
/// Request k's output length: 80 to 127 tokens. Equal lengths on 4 slots finish in
/// lockstep, and then every waiter's wait can stay inside the TTFT target the first requests
/// set, so nothing pauses (seen once in a fresh-clone CI run with 96 tokens each).
fn tokens(k: usize) -> u32 {
    80 + (k as u32 * 13) % 48
}

const LOAD: &str = "max_batch_size: 4\nmax_context_tokens: 4096\n\
    kv_cache_config: { tokens_per_block: 32, max_tokens: 65536 }\n\
    server: { stat_interval_s: 3600 }\n\
    scheduler_config:\n  gen_admission: { min_samples: 5, target_window: 50 }\n  \
    gen_preemption: { tpot_budget: 0.5 }\n";

fn capacity() -> BackendCapacity {
    BackendCapacity {
        kv_pages: 2048,
        tokens_per_block: 32,
        seq_slots: 8,
    }
}

fn sampling(k: usize) -> SamplingParams {
    match k % 4 {
        3 => SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 0,
            seed: Some(k as u64),
        },
        _ => SamplingParams::GREEDY,
    }
}

fn prompt(k: usize) -> Vec<u32> {
    synthetic(k.is_multiple_of(2), 1024, k as u32)
}

/// Runs the load; returns every request's tokens by (lane, round), the engine ids of the
/// requests that were paused or displaced, and how many pauses and displacements happened.
async fn serve(
    cfg: &Config,
    backend: CpuRefBackend,
) -> (BTreeMap<usize, Vec<u32>>, BTreeSet<usize>, usize, usize) {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let opts = StartOptions {
        record: true,
        ..StartOptions::default()
    };
    let engine = Arc::new(ActorEngine::start(cfg, Box::new(backend), clock, opts).unwrap());
    let lanes: Vec<_> = (0..LANES)
        .map(|lane| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for round in 0..ROUNDS {
                    let k = lane * ROUNDS + round;
                    let mut sub = engine
                        .submit(GenRequest {
                            prompt_tokens: prompt(k),
                            max_tokens: tokens(k),
                            min_tokens: 0,
                            ignore_eos: true,
                            arrival_unix_s: None,
                            sampling: sampling(k),
                            stop: Vec::new(),
                        })
                        .unwrap();
                    let mut toks = Vec::new();
                    loop {
                        match sub.events.recv().await {
                            Some(EngineEvent::Token { id }) => toks.push(id),
                            Some(end) => {
                                let want = EngineEvent::Finished {
                                    reason: FinishReason::Length,
                                };
                                assert_eq!(end, want, "request {k}");
                                break;
                            }
                            None => panic!("the engine dropped request {k}"),
                        }
                    }
                    got.push((k, sub.id, toks));
                }
                got
            })
        })
        .collect();
    let mut out = BTreeMap::new();
    let mut by_engine_id = BTreeMap::new();
    for lane in lanes {
        let got = tokio::time::timeout(Duration::from_secs(300), lane)
            .await
            .unwrap()
            .unwrap();
        for (k, id, toks) in got {
            by_engine_id.insert(id, k);
            out.insert(k, toks);
        }
    }
    let record = engine.take_record().await;
    let (mut pauses, mut displaced) = (0, 0);
    let mut touched = BTreeSet::new();
    for (_, o) in &record {
        pauses += o.pauses.len();
        displaced += o.displaced.len();
        for id in o.pauses.iter().chain(&o.displaced) {
            touched.extend(by_engine_id.get(id).copied());
        }
    }
    engine.shutdown(Duration::ZERO).await;
    (out, touched, pauses, displaced)
}

/// Each request alone on a plain backend of the same model.
fn solo_outputs(m: &Arc<CpuModel>) -> BTreeMap<usize, Vec<u32>> {
    let mut b = CpuRefBackend::new(m.clone(), None, capacity());
    (0..LANES * ROUNDS)
        .map(|k| {
            let req = ContextArrival {
                id: k as u64,
                slot: 0,
                prompt: prompt(k),
                pages: Vec::new(),
                sampling: sampling(k),
                min_tokens: 0,
            };
            let g = solo(&mut b, &req, tokens(k) as usize, &|_| Vec::new()).unwrap();
            (k, g.tokens)
        })
        .collect()
}

fn check(
    label: &str,
    m: &Arc<CpuModel>,
    (got, touched, pauses, displaced): (BTreeMap<usize, Vec<u32>>, BTreeSet<usize>, usize, usize),
) {
    eprintln!(
        "{label}: {pauses} pauses, {displaced} displacements, {} of {} requests paused or \
         displaced",
        touched.len(),
        got.len()
    );
    assert!(
        pauses > 0,
        "{label}: the load must make the controller pause"
    );
    let want = solo_outputs(m);
    assert_eq!(got.len(), want.len());
    for (k, toks) in &got {
        let kind = if touched.contains(k) {
            "paused or displaced"
        } else {
            "never paused"
        };
        assert_eq!(
            toks, &want[k],
            "{label}: request {k} ({kind}) differs from alone"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_drafter_on_every_paused_or_displaced_request_answers_as_alone() {
    let cfg = Config::from_yaml_str(
        &format!("{LOAD}drafter: {{ slots: 8, window_tokens: 64, max_draft_len: 4 }}\n"),
        "test",
    )
    .unwrap();
    let m = Arc::new(CpuModel::seeded(&ModelShape::named("tiny").unwrap(), 11));
    let d = DraftConfig {
        window: 64,
        max_draft_len: 4,
        max_ngram: 3,
    };
    let backend = CpuRefBackend::new(m.clone(), None, capacity())
        .with_drafter(d, 4)
        .unwrap();
    let r = serve(&cfg, backend).await;
    check("tiny, drafter on", &m, r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_hybrid_shape_every_paused_or_displaced_request_answers_as_alone() {
    let cfg = Config::from_yaml_str(
        &format!("{LOAD}model: {{ shape: tiny-hybrid }}\nrecurrent_state: {{ slots: 8 }}\n"),
        "test",
    )
    .unwrap();
    let m = Arc::new(CpuModel::seeded(
        &ModelShape::named("tiny-hybrid").unwrap(),
        11,
    ));
    let backend = CpuRefBackend::new(m.clone(), None, capacity());
    let r = serve(&cfg, backend).await;
    check("tiny-hybrid", &m, r);
}

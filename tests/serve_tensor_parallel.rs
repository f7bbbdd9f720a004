//! `parallel.tensor_parallel_size: N` in the server (SPEC §6.1): on the model backend the
//! executor leads N−1 follower cores, every pass's decisions are checked across the ranks,
//! `/debug/actors` and the stat line show the ranks and the passes checked, and a rank that
//! diverges stops the worker with the pass and both hashes. The cuda backend refuses N > 1.

mod serve_support;

use std::sync::Arc;
use std::time::Duration;

use genslot::actors::{supervisor, ActorEngine, StartOptions};
use genslot::config::{Backend, Config};
use genslot::gpu::model::ModelBackend;
use genslot::server::engine::{Engine, EngineEvent, FinishReason, GenRequest, SubmitError};
use genslot::timing::{Clock, VirtualClock};
use genslot::worker::ranks::{follow, frame, Link, RankError, RankGroup};
use genslot::worker::wire::decision_hash;
use genslot::worker::{PassInputs, WorkerCore, WorkerParams};
use serve_support::*;

const PREEMPTING: &str = "max_batch_size: 4\nkv_cache_config: { max_tokens: 64000 }\n\
    scheduler_config:\n  gen_admission: { min_samples: 5, target_window: 50 }\n  \
    gen_preemption: { tpot_budget: 0.5 }\n";

fn request(prompt: usize, max_tokens: u32) -> GenRequest {
    GenRequest {
        prompt_tokens: vec![1; prompt],
        max_tokens,
        min_tokens: 0,
        ignore_eos: true,
        arrival_unix_s: None,
        sampling: Default::default(),
        stop: Vec::new(),
    }
}

/// The engine on a virtual clock (steps take no real time), recording every pass.
fn virtual_engine(cfg: &Config, start_ranks: Option<genslot::actors::StartRanks>) -> ActorEngine {
    let clock: Arc<dyn Clock> = Arc::new(VirtualClock::new());
    let backend = ModelBackend::from_config(cfg, clock.clone());
    let opts = StartOptions {
        record: true,
        start_ranks,
        ..StartOptions::default()
    };
    ActorEngine::start(cfg, Box::new(backend), clock, opts).expect("start")
}

/// Runs `lanes` closed-loop clients of `per_lane` requests; the events each request ended with.
async fn run_lanes(engine: &Arc<ActorEngine>, lanes: usize, per_lane: usize) -> Vec<EngineEvent> {
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut ends = Vec::new();
                for i in 0..per_lane {
                    let prompt = 50 + (lane * 37 + i * 91) % 350;
                    let max_tokens = 80 + ((lane * 13 + i * 29) % 120) as u32;
                    let mut sub = match engine.submit(request(prompt, max_tokens)) {
                        Ok(s) => s,
                        Err(e) => {
                            ends.push(EngineEvent::Failed {
                                message: e.to_string(),
                            });
                            break;
                        }
                    };
                    loop {
                        match sub.recv().await {
                            Some(EngineEvent::Token { .. }) => {}
                            Some(end) => {
                                ends.push(end);
                                break;
                            }
                            None => panic!("the engine dropped a request"),
                        }
                    }
                }
                ends
            })
        })
        .collect();
    let mut ends = Vec::new();
    for t in tasks {
        ends.extend(tokio::time::timeout(WAIT * 3, t).await.unwrap().unwrap());
    }
    ends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ranks_check_every_pass_of_a_preempting_run() {
    let cfg = config(&format!(
        "{PREEMPTING}parallel: {{ tensor_parallel_size: 3 }}\n"
    ));
    let engine = Arc::new(virtual_engine(&cfg, None));
    let ends = run_lanes(&engine, 16, 4).await;
    assert!(ends.iter().all(|e| *e
        == EngineEvent::Finished {
            reason: FinishReason::Length
        }));
    assert_eq!(ends.len(), 64);

    // A timer may still run an empty pass after the last request ends: read the record and
    // the state until they agree on the passes run, so both describe the same passes.
    let mut record = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    let debug = loop {
        record.extend(engine.take_record().await);
        let debug = engine.debug_state().await;
        let run = Some(record.len() as u64);
        if debug["ranks"]["passes_checked"].as_u64() == run && Some(engine.passes()) == run {
            break debug;
        }
        assert!(tokio::time::Instant::now() < deadline, "{debug}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let pauses: usize = record.iter().map(|(_, o)| o.pauses.len()).sum();
    assert!(pauses > 0, "the load must exercise preemption");
    let ranks = &debug["ranks"];
    assert_eq!(ranks["ranks"], 3);
    assert_eq!(ranks["transport"], "channel");
    assert_eq!(ranks["passes_checked"].as_u64(), Some(engine.passes()));
    assert_eq!(ranks["passes_checked"].as_u64(), Some(record.len() as u64));
    assert!(ranks["failure"].is_null());
    // The last hash checked is the leader's last pass's.
    let last = record
        .last()
        .map(|(_, o)| format!("{:016x}", decision_hash(o)));
    assert_eq!(ranks["last_hash"].as_str(), last.as_deref());
}

/// The pass from which rank 1 of `diverging_ranks` sees a leader clock one second ahead.
const SKEWED_FROM: u64 = 40;

/// Ranks 1..N, rank 1 behind a relay that adds a second to `now` from pass `SKEWED_FROM`.
fn diverging_ranks(params: &WorkerParams, ranks: u32) -> Result<RankGroup, RankError> {
    let mut links = Vec::new();
    for rank in 1..ranks {
        let (ours, theirs) = Link::channel_pair();
        let mut core = WorkerCore::new(params.clone());
        let theirs = if rank == 1 { skewed(theirs) } else { theirs };
        std::thread::spawn(move || follow(rank, &mut core, theirs));
        links.push(ours);
    }
    RankGroup::new(links)
}

fn skewed(link: Link) -> Link {
    let (relay, inner) = Link::channel_pair();
    std::thread::spawn(move || {
        let (
            Link { mut tx, mut rx, .. },
            Link {
                tx: mut up,
                rx: mut down,
                ..
            },
        ) = (link, relay);
        let (mut buf, mut inp) = (Vec::new(), PassInputs::default());
        while rx.recv(&mut buf).is_ok() {
            if let Ok((pass, off)) = frame::decode_pass(&buf, &mut inp) {
                if pass >= SKEWED_FROM {
                    inp.now += 1.0;
                    frame::encode_pass(&mut buf, pass, off, &inp);
                }
            }
            if up.send(&buf).is_err() || down.recv(&mut buf).is_err() || tx.send(&buf).is_err() {
                return;
            }
        }
    });
    inner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_that_diverges_stops_the_worker_with_the_pass_and_both_hashes() {
    let cfg = config(&format!(
        "{PREEMPTING}parallel: {{ tensor_parallel_size: 2 }}\n"
    ));
    let engine = Arc::new(virtual_engine(&cfg, Some(diverging_ranks)));
    let ends = run_lanes(&engine, 8, 2).await;

    // What each side computed at the pass that diverged, from the leader's record.
    let record = engine.take_record().await;
    assert_eq!(
        record.len() as u64,
        SKEWED_FROM,
        "no pass after the mismatch"
    );
    let (params, _) = supervisor::setup(&cfg).unwrap();
    let mut follower = WorkerCore::new(params);
    let mut theirs = None;
    for (i, (inp, _)) in record.iter().enumerate() {
        let mut inp = inp.clone();
        if i as u64 + 1 == SKEWED_FROM {
            inp.now += 1.0;
        }
        theirs = Some(follower.pass(&inp));
    }
    let leader_hash = decision_hash(&record[record.len() - 1].1);
    let follower_hash = decision_hash(&theirs.unwrap());
    let want = RankError::Mismatch {
        pass: SKEWED_FROM,
        rank: 1,
        leader: leader_hash,
        follower: follower_hash,
    }
    .to_string();

    let failed: Vec<&str> = ends
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Failed { message } => Some(message.as_str()),
            _ => None,
        })
        .collect();
    assert!(!failed.is_empty(), "{ends:?}");
    assert!(failed.iter().any(|m| *m == want), "{failed:?} lacks {want}");
    let debug = engine.debug_state().await;
    assert_eq!(
        debug["executor"]["backend_down"].as_str(),
        Some(want.as_str())
    );
    assert_eq!(debug["ranks"]["failure"].as_str(), Some(want.as_str()));
    assert_eq!(debug["ranks"]["passes_checked"], SKEWED_FROM - 1);
    assert!(matches!(
        engine.submit(request(10, 10)),
        Err(SubmitError::Unavailable(_))
    ));
}

#[tokio::test]
async fn debug_actors_and_the_stat_line_show_the_ranks_and_passes_checked() {
    let logs = Captured::default();
    // The actors log from their own thread, so the subscriber must be global (the only
    // one this file sets).
    tracing::subscriber::set_global_default(capturing(&logs)).unwrap();
    let cfg = config("parallel: { tensor_parallel_size: 2 }\nserver: { stat_interval_s: 0.05 }\n");
    let server = Server::start(&cfg).await;
    let body = serde_json::json!({"prompt": "hello", "max_tokens": 8});
    let resp = server
        .client
        .post(server.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let debug = server.debug().await;
    assert_eq!(debug["ranks"]["ranks"], 2);
    let checked = debug["ranks"]["passes_checked"].as_u64().unwrap_or(0);
    assert!(checked >= 8, "{debug}");
    // Stat lines logged before the request's passes say `passes_checked=0` (a loaded
    // machine may log several), so wait for one that counts at least the passes
    // `/debug/actors` reported. Only engines of two ranks print ` ranks=2 `.
    let counted = |l: &str| -> Option<u64> {
        let (_, rest) = l.split_once(" ranks=2 passes_checked=")?;
        rest.split_whitespace().next()?.parse().ok()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let lines = logs.lines();
        let stat = lines.iter().filter(|l| l.contains("preemption: pauses="));
        if stat.filter_map(|l| counted(l)).any(|n| n >= checked) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            lines.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_cuda_backend_refuses_several_ranks_in_the_file_and_on_the_command_line() {
    let e = Config::from_yaml_str(
        "backend: cuda\nparallel: { tensor_parallel_size: 2 }\n",
        "tp.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("parallel.tensor_parallel_size") && e.contains("tp.yaml:2"),
        "{e}"
    );
    // `serve --backend cuda` over a model-backend file: refused before CUDA is looked for.
    let mut cfg = config("parallel: { tensor_parallel_size: 2 }\n");
    cfg.backend = Backend::Cuda;
    let e = genslot::actors::serve::serve_config(cfg, std::future::ready(()))
        .await
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("tensor_parallel_size"), "{e}");
}

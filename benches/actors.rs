//! Overheads of the running system, with every slot taken and a zero-time step (the model
//! backend on a virtual clock), at batch 1 (the fixed cost: two thread hand-offs), 128 and 256:
//! - `actor_pass`: time per scheduling pass — the pass, the step round trip to the GPU-step
//!   thread, the per-token events — with nobody reading the events;
//! - `actor_pass_streaming`: the same with a tokio task draining every request's events (each
//!   token wakes its reader, as an HTTP stream does);
//! - `server_sse_token`: the HTTP layer's cost per streamed token over loopback SSE, against
//!   an engine that has every token ready at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::future::BoxFuture;
use futures::FutureExt;
use genslot::actors::{ActorEngine, StartOptions};
use genslot::config::Config;
use genslot::gpu::model::ModelBackend;
use genslot::server::engine::{
    Engine, EngineEvent, FinishReason, GenRequest, Submission, SubmitError,
};
use genslot::server::{serve, App};
use genslot::timing::{Clock, VirtualClock};

/// The step and transfer times only advance a virtual clock: nothing sleeps.
const ZERO_TIME: &str =
    "kv_cache_config: { max_tokens: 300000000 }\nserver: { stat_interval_s: 3600 }\n";

/// `batch` requests decoding for ever on a zero-time backend; with `drain` a task reads
/// every request's events, else they are kept unread.
fn busy_engine(
    rt: &tokio::runtime::Runtime,
    batch: u32,
    drain: bool,
    held: &mut Vec<Submission>,
) -> ActorEngine {
    let yaml = format!("{ZERO_TIME}max_batch_size: {batch}\n");
    let cfg = Config::from_yaml_str(&yaml, "bench").expect("bench config");
    let clock: Arc<dyn Clock> = Arc::new(VirtualClock::new());
    let backend = ModelBackend::from_config(&cfg, clock.clone());
    let engine =
        ActorEngine::start(&cfg, Box::new(backend), clock, StartOptions::default()).expect("start");
    for _ in 0..batch {
        let mut sub = engine
            .submit(GenRequest {
                prompt_tokens: vec![1; 2048],
                max_tokens: 1_000_000 - 2048,
                min_tokens: 0,
                ignore_eos: true,
                arrival_unix_s: None,
                sampling: Default::default(),
                stop: Vec::new(),
            })
            .expect("submit");
        if drain {
            rt.spawn(async move { while sub.recv().await.is_some() {} });
        } else {
            held.push(sub);
        }
    }
    engine
}

fn actor_pass(c: &mut Criterion) {
    pass_group(c, "actor_pass", false);
    pass_group(c, "actor_pass_streaming", true);
}

fn pass_group(c: &mut Criterion, name: &str, drain: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group(name);
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for batch in [1u32, 128, 256] {
        let mut held = Vec::new();
        let engine = busy_engine(&rt, batch, drain, &mut held);
        // Warm up until every request is in the batch.
        while engine.passes() < 200 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (cpu0, passes0) = (process_cpu_s(), engine.passes());
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, _| {
            b.iter_custom(|iters| {
                // Sleep between looks so this thread does not take a core from the actors;
                // the time is scaled to the passes actually run.
                let p0 = engine.passes();
                let t = Instant::now();
                let mut done = 0;
                while done < iters {
                    std::thread::sleep(Duration::from_micros(200));
                    done = engine.passes() - p0;
                }
                t.elapsed().mul_f64(iters as f64 / done as f64)
            })
        });
        // CPU time does not depend on what else the machine runs, unlike the wall time.
        let passes = engine.passes() - passes0;
        if let (Some(c0), Some(c1)) = (cpu0, process_cpu_s()) {
            eprintln!(
                "{name}/{batch}: {passes} passes, {:.1} µs CPU per pass (every thread of the process)",
                (c1 - c0) * 1e6 / passes.max(1) as f64
            );
        }
        drop(engine);
        drop(held);
    }
    g.finish();
}

/// User + system CPU seconds of this process so far (Linux; `None` elsewhere).
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which ends at the last ')': utime and stime are the
    // 12th and 13th, in clock ticks (100 a second on Linux).
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: f64 = f.next()?.parse().ok()?;
    let stime: f64 = f.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn server_sse_token(c: &mut Criterion) {
    const TOKENS: u64 = 512;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let metrics = genslot::metrics::install_recorder().expect("recorder");
    let client = reqwest::Client::new();
    let body = serde_json::json!({"prompt": "a", "max_tokens": TOKENS, "ignore_eos": true,
                                  "stream": true});
    let mut g = c.benchmark_group("server_sse_token");
    g.throughput(Throughput::Elements(TOKENS));
    for (name, trickle) in [("coalesced_512", false), ("one_by_one_512", true)] {
        let app = App::new(Arc::new(Burst { trickle }), metrics.clone(), "bench".into());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let url = format!(
            "http://{}/v1/completions",
            listener.local_addr().expect("addr")
        );
        rt.spawn(serve(listener, app, std::future::pending()));
        let fetch = || {
            rt.block_on(async {
                client
                    .post(&url)
                    .json(&body)
                    .send()
                    .await
                    .expect("send")
                    .text()
                    .await
                    .expect("body")
            })
        };
        let events = fetch().matches("data: ").count();
        eprintln!("server_sse_token/{name}: {events} SSE events for {TOKENS} tokens");
        g.bench_function(name, |b| {
            b.iter(|| assert!(fetch().ends_with("data: [DONE]\n\n")))
        });
    }
    g.finish();
}

/// Every token of a request is in its channel at submission: the stream costs only the
/// HTTP layer (the mock engine paces tokens with timers of millisecond resolution).
/// With `trickle`, tokens are sent one at a time from a task that yields between them, so
/// most tokens become their own SSE event (the server coalesces whatever is queued).
struct Burst {
    trickle: bool,
}

impl Engine for Burst {
    fn submit(&self, req: GenRequest) -> Result<Submission, SubmitError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let trickle = self.trickle;
        let send = async move {
            for i in 0..req.max_tokens {
                let _ = tx.send(EngineEvent::Token { id: i });
                if trickle {
                    tokio::task::yield_now().await;
                }
            }
            let _ = tx.send(EngineEvent::Finished {
                reason: FinishReason::Length,
            });
        };
        if trickle {
            tokio::spawn(send);
        } else {
            futures::executor::block_on(send);
        }
        Ok(Submission::new(1, rx, |_| {}))
    }
    fn cancel(&self, _: u64) {}
    fn debug_state(&self) -> BoxFuture<'static, serde_json::Value> {
        async { serde_json::Value::Null }.boxed()
    }
    fn max_context_tokens(&self) -> usize {
        1 << 20
    }
    fn shutdown(&self, _: Duration) -> BoxFuture<'static, ()> {
        async {}.boxed()
    }
}

criterion_group!(benches, actor_pass, server_sse_token);
criterion_main!(benches);

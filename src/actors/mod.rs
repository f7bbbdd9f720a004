//! The actor runtime (SPEC §5): one actor per scheduling component (admission queue,
//! preemption controller, slot, KV, recurrent-state and drafter pools), the executor that
//! runs the scheduling pass against them, the GPU-step actor on its own OS thread owning
//! the step backend, and the supervisor that owns the setup decision and can turn
//! preemption off at run time.
//! [`ActorEngine`] is the HTTP server's [`Engine`] over them.
//!
//! The actors run in an actix `System` on a dedicated thread, so the HTTP stack stays a
//! plain tokio runtime (`notes/deps.md` §3: `Actor::start` from a bare tokio runtime panics).

pub mod components;
pub mod executor;
pub mod gpu;
pub mod messages;
pub mod record;
pub mod serve;
pub mod supervisor;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::json;

use crate::config::Config;
use crate::gpu::StepBackend;
use crate::policy::setup::SetupError;
use crate::server::engine::{Engine, GenRequest, Submission, SubmitError};
use crate::server::latency::now_unix_s;
use crate::timing::Clock;
use crate::worker::ranks::{RankError, RankGroup};
use crate::worker::{PassInputs, PassOutput};

use components::Components;
use executor::{AttachGpu, Executor, ExecutorInit, Shared};
use messages::{
    Cancel, DebugState, Disable, GetSupervisorState, Shutdown, Submit, TakeRecord, WaitIdle,
};
use supervisor::{Attach, Supervisor, SupervisorState};

/// The message each in-flight request fails with at shutdown.
pub const SHUTDOWN_MESSAGE: &str = "the server is shutting down; request not completed";

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("cannot start the actor system: {0}")]
    Spawn(String),
}

/// How to start the actor system besides the config.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Token id that ends a request (past `min_tokens`, without `ignore_eos`).
    pub eos_token: Option<u32>,
    /// Keep every pass's inputs and outputs, for [`ActorEngine::take_record`].
    pub record: bool,
    /// `serve --record`: one line per request leaving the scheduler ([`record`]).
    pub recorder: Option<record::Recorder>,
    /// Starts the other tensor-parallel ranks (default `RankGroup::spawn_local`; tests
    /// start a faulty one).
    pub start_ranks: Option<StartRanks>,
}

/// Starts ranks 1..N of a worker of these params.
pub type StartRanks = fn(&crate::worker::WorkerParams, u32) -> Result<RankGroup, RankError>;

struct Addrs {
    executor: Addr<Executor>,
    components: Components,
    supervisor: Addr<Supervisor>,
    system: actix::System,
}

/// The running actor system, as the server's engine.
pub struct ActorEngine {
    executor: Addr<Executor>,
    components: Components,
    supervisor: Addr<Supervisor>,
    system: actix::System,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    shared: Arc<Shared>,
    clock: Arc<dyn Clock>,
    next_id: AtomicU64,
    max_waiting: usize,
    max_context_tokens: usize,
    kv_tokens: u64,
}

impl ActorEngine {
    /// Runs the setup decision (logging its one warning), sizes the worker, and starts the
    /// supervisor, the executor and the GPU-step thread around `backend`.
    pub fn start(
        cfg: &Config,
        backend: Box<dyn StepBackend>,
        clock: Arc<dyn Clock>,
        opts: StartOptions,
    ) -> Result<ActorEngine, StartError> {
        let (params, sup_state) = supervisor::setup(cfg)?;
        let tp = cfg.parallel.tensor_parallel_size;
        let start_ranks = opts.start_ranks.unwrap_or(RankGroup::spawn_local);
        let ranks = (tp > 1)
            .then(|| start_ranks(&params, tp))
            .transpose()
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        let max_waiting = params.admission.max_waiting;
        let kv_tokens = u64::from(params.kv.total_pages) * u64::from(params.kv.tokens_per_block);
        let shared = Arc::new(Shared::default());
        let stat_interval = (cfg.server.stat_interval_s > 0.0
            && cfg.server.stat_interval_s.is_finite())
        .then(|| Duration::from_secs_f64(cfg.server.stat_interval_s));
        let (tx, rx) = std::sync::mpsc::channel::<Result<Addrs, String>>();
        let (sh, ck) = (shared.clone(), clock.clone());
        let thread = std::thread::Builder::new()
            .name("genslot-actors".into())
            .spawn(move || {
                let sys = actix::System::new();
                let started = sys.block_on(async move {
                    let supervisor = Supervisor::new(sup_state).start();
                    let components = Components::start(&params);
                    let executor = Executor::new(ExecutorInit {
                        params,
                        components: components.clone(),
                        clock: ck,
                        shared: sh,
                        supervisor: supervisor.clone(),
                        eos_token: opts.eos_token,
                        stat_interval,
                        record: opts.record,
                        recorder: opts.recorder,
                        ranks,
                    })
                    .start();
                    supervisor.do_send(Attach(executor.clone()));
                    let gpu = gpu::spawn(backend, executor.clone()).map_err(|e| e.to_string())?;
                    executor.do_send(AttachGpu(gpu));
                    Ok(Addrs {
                        executor,
                        components,
                        supervisor,
                        system: actix::System::current(),
                    })
                });
                let ok = started.is_ok();
                let _ = tx.send(started);
                if ok {
                    let _ = sys.run();
                }
            })
            .map_err(|e| StartError::Spawn(e.to_string()))?;
        let addrs = rx
            .recv()
            .map_err(|_| StartError::Spawn("the actor thread ended during start".into()))?
            .map_err(StartError::Spawn)?;
        Ok(ActorEngine {
            executor: addrs.executor,
            components: addrs.components,
            supervisor: addrs.supervisor,
            system: addrs.system,
            thread: std::sync::Mutex::new(Some(thread)),
            shared,
            clock,
            next_id: AtomicU64::new(1),
            max_waiting,
            max_context_tokens: usize::try_from(cfg.max_context_tokens).unwrap_or(usize::MAX),
            kv_tokens,
        })
    }

    /// Turn preemption off at run time; paused requests resume at the next pass.
    pub fn disable_preemption(&self, why: &str) {
        self.supervisor.do_send(Disable { why: why.into() });
    }

    pub async fn supervisor_state(&self) -> Option<SupervisorState> {
        self.supervisor.send(GetSupervisorState).await.ok()
    }

    /// Stop one component actor (`components::NAMES`) as a crash would: the failure
    /// path's tests use it. False for an unknown name or a pool this worker lacks.
    pub fn halt_component(&self, name: &str) -> bool {
        self.components.halt(name)
    }

    /// Scheduling passes run so far.
    pub fn passes(&self) -> u64 {
        self.shared.passes.load(Ordering::Relaxed)
    }

    /// Every pass's inputs and outputs since the last call (with `StartOptions::record`).
    pub async fn take_record(&self) -> Vec<(PassInputs, PassOutput)> {
        self.executor.send(TakeRecord).await.unwrap_or_default()
    }

    /// The leader clock's reading for an upstream unix arrival time (never in the future).
    fn leader_arrival(&self, arrival_unix_s: Option<f64>) -> f64 {
        let now = self.clock.now();
        match arrival_unix_s {
            Some(a) if a.is_finite() => now - (now_unix_s() - a).max(0.0),
            _ => now,
        }
    }
}

impl Engine for ActorEngine {
    fn submit(&self, req: GenRequest) -> Result<Submission, SubmitError> {
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return Err(SubmitError::Unavailable("shutting down".into()));
        }
        if let Some(why) = self.shared.down_reason() {
            return Err(SubmitError::Unavailable(why));
        }
        let total = req.prompt_tokens.len() as u64 + u64::from(req.max_tokens);
        if total > self.max_context_tokens as u64 {
            return Err(SubmitError::Invalid(format!(
                "prompt ({} tokens) + max_tokens ({}) exceed the context limit of {} tokens",
                req.prompt_tokens.len(),
                req.max_tokens,
                self.max_context_tokens
            )));
        }
        if total > self.kv_tokens {
            // It could never be admitted and would block the queue's head forever.
            return Err(SubmitError::Invalid(format!(
                "prompt + max_tokens ({total} tokens) exceed the KV cache ({} tokens)",
                self.kv_tokens
            )));
        }
        let max = self.max_waiting;
        self.shared
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q < max).then_some(q + 1)
            })
            .map_err(|_| SubmitError::QueueFull { max_waiting: max })?;
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let arrival = self.leader_arrival(req.arrival_unix_s);
        if !self.executor.connected() {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Unavailable(
                "the scheduler is not running".into(),
            ));
        }
        // `do_send`, not `try_send`: the mailbox bound (16) would refuse bursts; the queue
        // bound is `max_waiting`, checked above. If the executor stops after this check, the
        // event channel closes and the request ends as failed.
        self.executor.do_send(Submit {
            id,
            arrival,
            req,
            events: tx,
        });
        let ex = self.executor.clone();
        Ok(Submission::new(id, rx, move |id| ex.do_send(Cancel(id))))
    }

    fn cancel(&self, id: u64) {
        self.executor.do_send(Cancel(id));
    }

    fn debug_state(&self) -> BoxFuture<'static, serde_json::Value> {
        let ex = self.executor.send(DebugState);
        let sup = self.supervisor.send(GetSupervisorState);
        async move {
            let (ex, sup) = futures::join!(ex, sup);
            let mut v = ex.unwrap_or_else(|_| json!({"executor": "stopped"}));
            if let Some(o) = v.as_object_mut() {
                o.insert(
                    "supervisor".into(),
                    sup.map_or(json!("stopped"), |s| json!(s)),
                );
            }
            v
        }
        .boxed()
    }

    fn max_context_tokens(&self) -> usize {
        self.max_context_tokens
    }

    fn shutdown(&self, drain: Duration) -> BoxFuture<'static, ()> {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        let ex = self.executor.clone();
        let system = self.system.clone();
        async move {
            // In-flight requests (queued ones too) run on until none is left or the window
            // closes; whatever is left then fails with the shutdown message.
            let idle = ex.send(WaitIdle);
            if tokio::time::timeout(drain, idle).await.is_err() {
                tracing::warn!(
                    "drain window of {} s over; failing the requests still in flight",
                    drain.as_secs_f64()
                );
            }
            let _ = ex
                .send(Shutdown {
                    reason: SHUTDOWN_MESSAGE.into(),
                })
                .await;
            system.stop();
        }
        .boxed()
    }
}

impl Drop for ActorEngine {
    fn drop(&mut self) {
        self.system.stop();
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

//! The GPU-step actor: one OS thread that owns the [`StepBackend`] (CUDA calls block, so
//! they stay off the actix thread). It takes [`GpuMsg`]s from a channel, reports steps and
//! context arrivals back to the executor, and refuses a step that holds a paused request:
//! a cross-check that the executor's batch and the controller's decisions agree.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use actix::Addr;
use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;

use super::executor::Executor;
use super::messages::{BackendDown, GpuMsg, KvArrived, StepDone};
use crate::gpu::{BackendError, ContextArrival, ContextLane, StepBackend};
use crate::ids::RequestId;

/// What the GPU-step actor shows in `/debug/actors`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuState {
    pub steps: u64,
    pub last_step_s: Option<f64>,
    pub last_batch: usize,
    pub context_arrivals: u64,
    pub paused: usize,
    pub retained: usize,
    pub failures: u64,
    pub last_error: Option<String>,
    pub running: bool,
}

/// The executor's handle on the GPU-step thread.
#[derive(Debug, Clone)]
pub struct GpuHandle {
    tx: Sender<GpuMsg>,
    /// The backend reads `StepRow::pages`.
    pub needs_pages: bool,
    state: Arc<Mutex<GpuState>>,
}

impl GpuHandle {
    /// False when the thread is gone.
    pub fn send(&self, msg: GpuMsg) -> bool {
        self.tx.send(msg).is_ok()
    }
    pub fn state(&self) -> GpuState {
        lock(&self.state).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the thread. It stops on [`GpuMsg::Stop`] or when every handle is dropped.
pub fn spawn(
    backend: Box<dyn StepBackend>,
    executor: Addr<Executor>,
) -> std::io::Result<GpuHandle> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let needs_pages = backend.needs_page_tables();
    let state = Arc::new(Mutex::new(GpuState {
        running: true,
        ..GpuState::default()
    }));
    let st = state.clone();
    std::thread::Builder::new()
        .name("genslot-gpu-step".into())
        .spawn(move || {
            let ex = executor.clone();
            let outcome = catch_unwind(AssertUnwindSafe(|| run(backend, rx, &executor, &st)));
            lock(&st).running = false;
            if let Err(panic) = outcome {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                ex.do_send(BackendDown(format!("the GPU-step thread panicked: {what}")));
            }
        })?;
    Ok(GpuHandle {
        tx,
        needs_pages,
        state,
    })
}

fn run(
    mut backend: Box<dyn StepBackend>,
    rx: Receiver<GpuMsg>,
    executor: &Addr<Executor>,
    state: &Mutex<GpuState>,
) {
    let lane = backend.context_lane();
    let mut paused: BTreeSet<RequestId> = BTreeSet::new();
    let mut retained: BTreeSet<RequestId> = BTreeSet::new();
    while let Ok(msg) = rx.recv() {
        // Pause, resume, retain and release change what `/debug/actors` shows at once, not
        // at the next step (which may never come once the worker is idle).
        let shown_changes = matches!(
            msg,
            GpuMsg::Pause(_) | GpuMsg::Resume(_) | GpuMsg::Retain(_) | GpuMsg::Release(_)
        );
        match msg {
            GpuMsg::Admit(a) => {
                lock(state).context_arrivals += 1;
                match &lane {
                    Some(lane) => arrive_beside(lane.clone(), a.0, executor.clone()),
                    None => {
                        let result = backend.context_arrival(&a.0);
                        executor.do_send(KvArrived { id: a.0.id, result });
                    }
                }
            }
            GpuMsg::Pause(p) => paused.extend(p.0),
            GpuMsg::Resume(r) => r.0.iter().for_each(|id| {
                paused.remove(id);
            }),
            GpuMsg::Retain(r) => retained = r.0.into_iter().collect(),
            GpuMsg::Release(r) => {
                paused.remove(&r.0);
                retained.remove(&r.0);
                backend.release(r.0);
            }
            GpuMsg::Step(s) => {
                let mut out = s.out;
                let result = match s.rows.iter().find(|r| paused.contains(&r.id)) {
                    Some(r) => Err(BackendError::Failed(format!(
                        "request {} is paused but was put in the batch",
                        r.id
                    ))),
                    None => backend.step_into(&s.rows, &mut out).map(|()| out),
                };
                {
                    let mut st = lock(state);
                    match &result {
                        Ok(o) => {
                            st.steps += 1;
                            st.last_step_s = Some(o.step_s);
                            st.last_batch = s.rows.len();
                        }
                        Err(e) => {
                            st.failures += 1;
                            st.last_error = Some(e.to_string());
                        }
                    }
                    st.paused = paused.len();
                    st.retained = retained.len();
                }
                let done = StepDone {
                    pass: s.pass,
                    result,
                    rows: s.rows,
                };
                executor.do_send(done);
            }
            GpuMsg::Capacity(reply) => {
                let _ = reply.send(backend.capacity());
            }
            GpuMsg::Stop => break,
        }
        if shown_changes {
            let mut st = lock(state);
            st.paused = paused.len();
            st.retained = retained.len();
        }
    }
}

/// A context arrival on its own thread, so transfers overlap the decode steps.
fn arrive_beside(lane: Arc<dyn ContextLane>, req: ContextArrival, executor: Addr<Executor>) {
    let id = req.id;
    let ex = executor.clone();
    let spawned = std::thread::Builder::new()
        .name("genslot-kv-arrival".into())
        .spawn(move || {
            let result = catch_unwind(AssertUnwindSafe(|| lane.context_arrival(&req)))
                .unwrap_or_else(|_| Err(BackendError::Failed("context arrival panicked".into())));
            executor.do_send(KvArrived { id, result });
        });
    if let Err(e) = spawned {
        ex.do_send(KvArrived {
            id,
            result: Err(BackendError::Failed(format!(
                "cannot start the context arrival: {e}"
            ))),
        });
    }
}

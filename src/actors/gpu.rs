//! The GPU-step actor: one OS thread that owns the [`StepBackend`] (CUDA calls block, so
//! they stay off the actix thread). It takes [`GpuMsg`]s from a channel, reports steps and
//! context arrivals back to the executor, and refuses a step that holds a paused request:
//! a cross-check that the executor's batch and the controller's decisions agree.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use actix::Addr;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde::Serialize;

use super::executor::Executor;
use super::messages::{BackendDown, GpuMsg, KvArrived, StepDone};
use crate::gpu::{BackendError, ContextArrival, ContextLane, StepBackend};
use crate::policy::RequestId;

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

/// How long the GPU-step thread polls its channel after a step before it parks: a short
/// pass's messages come within it, sparing a futex wake-up. Once it parks, an idle worker
/// costs nothing.
const NEXT_STEP_SPIN: Duration = Duration::from_micros(30);
/// How long the executor spins on a step's result before it sleeps (until the GPU-step
/// thread wakes it or its budget ends).
const RESULT_SPIN: Duration = Duration::from_micros(20);
/// Spinning pays only with cores to spare: on a smaller host a spinning thread takes the
/// core the other side needs (measured: a zero-time pass at batch 1 went from 16–28 µs to
/// 48–62 µs on 2 busy cores), so there both sides sleep at once.
const SPIN_MIN_CORES: usize = 4;

/// The spin budgets for this host: (GPU-step thread, executor).
fn spin_budgets() -> (Duration, Duration) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= SPIN_MIN_CORES {
        (NEXT_STEP_SPIN, RESULT_SPIN)
    } else {
        (Duration::ZERO, Duration::ZERO)
    }
}

/// The executor's handle on the GPU-step thread.
#[derive(Debug, Clone)]
pub struct GpuHandle {
    tx: Sender<GpuMsg>,
    /// The backend reads `StepRow::pages`.
    pub needs_pages: bool,
    state: Arc<Mutex<GpuState>>,
    /// Where a step's result waits when the executor polls for it.
    pub ret: Arc<StepReturn>,
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

const IDLE: u8 = 0;
const WAITING: u8 = 1;
const READY: u8 = 2;

/// A short step's result handed straight to an executor that polls for it, instead of
/// through the actix mailbox (an eventfd wake-up of the actor thread). Whoever moves the
/// state first decides: the GPU-step thread (`WAITING → READY`: the executor takes it) or
/// the executor giving up (`WAITING → IDLE`: the result goes by message as before).
#[derive(Default)]
pub struct StepReturn {
    state: AtomicU8,
    done: Mutex<Option<StepDone>>,
    /// The executor's thread, woken when the result is ready.
    waiter: OnceLock<Thread>,
    /// How long the executor spins before it sleeps.
    spin: Duration,
}

impl std::fmt::Debug for StepReturn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("StepReturn").field("state", &state).finish()
    }
}

impl StepReturn {
    /// The executor will poll for the result of the step it is about to send.
    pub fn expect(&self) {
        self.waiter.get_or_init(std::thread::current);
        self.state.store(WAITING, Ordering::SeqCst);
    }

    /// GPU-step thread: hand `done` to a polling executor; back to the caller otherwise.
    fn offer(&self, done: StepDone) -> Option<StepDone> {
        if self.state.load(Ordering::SeqCst) != WAITING {
            return Some(done);
        }
        *lock(&self.done) = Some(done);
        match self
            .state
            .compare_exchange(WAITING, READY, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => {
                if let Some(t) = self.waiter.get() {
                    t.unpark();
                }
                None
            }
            Err(_) => lock(&self.done).take(),
        }
    }

    /// Executor: poll up to `budget` for the result; `None` when it will come by message.
    pub fn wait(&self, budget: Duration) -> Option<StepDone> {
        let start = Instant::now();
        loop {
            if self.state.load(Ordering::SeqCst) == READY {
                self.state.store(IDLE, Ordering::SeqCst);
                return lock(&self.done).take();
            }
            let waited = start.elapsed();
            if waited < budget.min(self.spin) {
                spin();
                continue;
            }
            if waited < budget {
                // A wake-up left from an earlier step only ends this sleep early.
                std::thread::park_timeout(budget - waited);
                continue;
            }
            let gave_up =
                self.state
                    .compare_exchange(WAITING, IDLE, Ordering::SeqCst, Ordering::SeqCst);
            if gave_up.is_ok() {
                return None;
            }
            self.state.store(IDLE, Ordering::SeqCst);
            return lock(&self.done).take();
        }
    }
}

fn spin() {
    for _ in 0..32 {
        std::hint::spin_loop();
    }
}

/// The next message, polling until `until` before parking on the channel.
fn recv_soon(rx: &Receiver<GpuMsg>, until: Option<Instant>) -> Option<GpuMsg> {
    if let Some(until) = until {
        loop {
            match rx.try_recv() {
                Ok(m) => return Some(m),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if Instant::now() >= until => break,
                Err(TryRecvError::Empty) => spin(),
            }
        }
    }
    rx.recv().ok()
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
    let (next_step_spin, result_spin) = spin_budgets();
    let ret = Arc::new(StepReturn {
        spin: result_spin,
        ..StepReturn::default()
    });
    let back = ret.clone();
    std::thread::Builder::new()
        .name("genslot-gpu-step".into())
        .spawn(move || {
            let ex = executor.clone();
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                run(backend, rx, &executor, &st, &back, next_step_spin)
            }));
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
        ret,
    })
}

fn run(
    mut backend: Box<dyn StepBackend>,
    rx: Receiver<GpuMsg>,
    executor: &Addr<Executor>,
    state: &Mutex<GpuState>,
    ret: &StepReturn,
    next_step_spin: Duration,
) {
    let lane = backend.context_lane();
    let mut paused: BTreeSet<RequestId> = BTreeSet::new();
    let mut retained: BTreeSet<RequestId> = BTreeSet::new();
    // Poll (rather than park) until then: set after each step.
    let mut spin_until: Option<Instant> = None;
    while let Some(msg) = recv_soon(&rx, spin_until) {
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
                if let Some(done) = ret.offer(done) {
                    executor.do_send(done);
                }
                spin_until = (!next_step_spin.is_zero()).then(|| Instant::now() + next_step_spin);
            }
            GpuMsg::Capacity(reply) => {
                let _ = reply.send(backend.capacity());
            }
            GpuMsg::Stop => break,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::StepOutput;

    fn done(pass: u64) -> StepDone {
        StepDone {
            pass,
            result: Ok(StepOutput::default()),
            rows: Vec::new(),
        }
    }

    #[test]
    fn a_result_offered_while_the_executor_waits_is_handed_over() {
        let ret = Arc::new(StepReturn::default());
        ret.expect();
        let gpu = ret.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            gpu.offer(done(7)).is_none()
        });
        let got = ret.wait(Duration::from_secs(30));
        assert!(
            t.join().unwrap(),
            "the GPU side kept a result that was taken"
        );
        assert_eq!(got.map(|d| d.pass), Some(7));
    }

    #[test]
    fn a_result_after_the_executor_gave_up_goes_back_to_be_sent_as_a_message() {
        let ret = StepReturn::default();
        ret.expect();
        assert!(ret.wait(Duration::from_micros(1)).is_none());
        assert_eq!(ret.offer(done(3)).map(|d| d.pass), Some(3));
    }

    #[test]
    fn nothing_is_held_back_when_the_executor_does_not_wait() {
        let ret = StepReturn::default();
        assert_eq!(ret.offer(done(1)).map(|d| d.pass), Some(1));
        // The next waited-for step still gets through.
        ret.expect();
        assert!(ret.offer(done(2)).is_none());
        assert_eq!(ret.wait(Duration::ZERO).map(|d| d.pass), Some(2));
    }
}

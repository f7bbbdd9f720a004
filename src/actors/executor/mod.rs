//! The executor: runs the scheduling pass. One pass per step — the pass machine
//! (`worker::PassMachine::run`, the one place the order ingest → track/resume/pause → admit
//! → build batch exists) exchanging batch messages with the component actors, then the
//! GPU-step actor steps the batch, then the next pass takes the step's results. It turns
//! the pass's decisions into messages to the GPU-step actor (`Admit`, `Pause`, `Resume`,
//! `Retain`, `Release`, `Step`), streams tokens to the clients and records the metrics.
//! A component actor that stops fails every in-flight request, like a backend that stops.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, MessageResult,
    ResponseActFuture, WrapFuture,
};
use metrics::{counter, histogram};
use tokio::sync::mpsc::UnboundedSender;

use super::components::{ActorPorts, Components};
use super::gpu::GpuHandle;
use super::messages::*;
use super::record::{Leaving, Recorder};
use crate::gpu::{ContextArrival, StepOutput, StepRow};
use crate::ids::RequestId;
use crate::metrics as m;
use crate::policy::kv_stall;
use crate::sampling::SamplingParams;
use crate::server::engine::{EngineEvent, FinishReason};
use crate::timing::Clock;
use crate::worker::ranks::RankGroup;
use crate::worker::{
    Arrival, BatchRow, KvReady, PassInputs, PassMachine, PassOutput, WorkerParams,
};
use crate::workload::recording::Outcome;

mod observe;

/// How often a pass runs while nothing steps but the worker is not idle (KV in transfer).
const POLL: Duration = Duration::from_millis(2);
/// How often the pool gauges are read from the pool actors.
const POOL_METRICS: Duration = Duration::from_millis(250);

/// State the HTTP-facing engine reads without a message round trip.
#[derive(Debug, Default)]
pub struct Shared {
    /// Requests submitted and not yet admitted, cancelled or refused (the queue bound).
    pub queued: AtomicUsize,
    pub shutting_down: AtomicBool,
    /// Passes run so far.
    pub passes: AtomicU64,
    /// Why the backend is down, once it is.
    pub down: Mutex<Option<String>>,
}

impl Shared {
    pub fn down_reason(&self) -> Option<String> {
        self.down.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn set_down(&self, why: &str) {
        let mut d = self.down.lock().unwrap_or_else(|p| p.into_inner());
        d.get_or_insert_with(|| why.to_owned());
    }
}

/// Request ids are a counter, not attacker-chosen keys: one multiply spreads them, where
/// the default SipHash took ~6 % of a batch-256 pass's samples.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

struct Live {
    events: UnboundedSender<EngineEvent>,
    arrival: f64,
    prompt: Vec<u32>,
    max_tokens: u32,
    min_tokens: u32,
    ignore_eos: bool,
    sampling: SamplingParams,
    /// Tokens sent to the client.
    sent: u32,
    last_token: u32,
    waiting: bool,
    stop: bool,
    /// The first token as the backend gave it at the context's arrival, until it is
    /// streamed when the request is first scheduled.
    first_at_arrival: Option<u32>,
    /// Paused in place now (a cancel then counts in `CANCELLED_WHILE_PAUSED_TOTAL`).
    paused: bool,
    /// When the request was admitted and when its context arrived (the context-arrival
    /// histogram; `--record`), when the first token was streamed, and the pauses so far
    /// (`--record`).
    admitted_at: Option<f64>,
    kv_ready_at: Option<f64>,
    first_token_at: Option<f64>,
    pauses: u32,
}

impl Live {
    /// Streams `t` unless the request has its `max_tokens` or has stopped; false once it
    /// has (the model's EOS, past `min_tokens` and unless ignored, stops it unsent). `now`
    /// (with `--record` only) stamps the first token sent.
    fn stream(&mut self, t: u32, eos: Option<u32>, now: Option<f64>) -> bool {
        if self.stop || self.sent >= self.max_tokens {
            return false;
        }
        if !self.ignore_eos && self.sent >= self.min_tokens && Some(t) == eos {
            self.stop = true;
            return false;
        }
        let _ = self.events.send(EngineEvent::Token { id: t });
        if self.sent == 0 {
            self.first_token_at = now;
        }
        self.sent += 1;
        self.last_token = t;
        true
    }
}

pub struct ExecutorInit {
    pub params: WorkerParams,
    /// The component actors, started for `params`.
    pub components: Components,
    pub clock: Arc<dyn Clock>,
    pub shared: Arc<Shared>,
    pub supervisor: actix::Addr<super::supervisor::Supervisor>,
    pub eos_token: Option<u32>,
    pub stat_interval: Option<Duration>,
    /// Keep every pass's inputs and outputs (tests replay them through a fresh core).
    pub record: bool,
    /// `serve --record`: where each request's line goes when it leaves.
    pub recorder: Option<Recorder>,
    /// The other tensor-parallel ranks, checked every pass (`None` with one rank).
    pub ranks: Option<RankGroup>,
}

/// What a pass needs, moved out of the executor while the pass runs and back after it.
struct PassState {
    machine: PassMachine,
    ports: ActorPorts,
    inp: PassInputs,
    /// The pass's decisions; its buffers are reused by the next pass.
    out: PassOutput,
    /// Page tables of the pass's admissions, then of its batch rows when the backend
    /// wants them.
    pages: Vec<Vec<u32>>,
    ranks: Option<RankGroup>,
}

pub struct Executor {
    /// `None` only while a pass runs.
    state: Option<PassState>,
    components: Components,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    supervisor: actix::Addr<super::supervisor::Supervisor>,
    gpu: Option<GpuHandle>,
    eos_token: Option<u32>,
    stat_interval: Option<Duration>,
    /// Hashed: looked up twice per row per pass. Never iterated in hash order.
    live: HashMap<RequestId, Live, BuildHasherDefault<IdHasher>>,
    pending: PassInputs,
    /// The batch of the step in flight.
    stepping: Option<(u64, Vec<BatchRow>)>,
    /// When (the clock's seconds) the step in flight was sent: `/debug/actors` shows how
    /// long it has run, so a step that hangs on the device is seen as one.
    stepping_since: f64,
    /// Buffers of finished steps, reused so a steady pass allocates little.
    spare_batch: Vec<BatchRow>,
    spare_rows: Vec<StepRow>,
    /// The last step's output buffers; its token vectors come back from the pass inputs.
    spare_out: StepOutput,
    /// When the last step's result came back, while the next one is still to be sent: the
    /// start of the gap `STEP_GAP_SECONDS` measures (cleared when a pass sends no step).
    last_step_back: Option<std::time::Instant>,
    pass_queued: bool,
    poll_queued: bool,
    last_step: Option<(f64, usize)>,
    /// Last set sent in a `Retain` (sent again only when it changes).
    retained: Vec<RequestId>,
    /// Rows that waited for a KV page, and requests aborted for one, since the last stat line.
    kv: observe::KvCounts,
    record: Option<Vec<(PassInputs, PassOutput)>>,
    recorder: Option<Recorder>,
    stopped: bool,
    /// A component actor stopped: no pass runs any more.
    broken: bool,
    /// Told when no request is in flight any more (the shutdown drain waits on it).
    idle_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Executor {
    pub fn new(init: ExecutorInit) -> Self {
        let ports = ActorPorts::new(init.components.clone(), &init.params);
        Executor {
            state: Some(PassState {
                machine: PassMachine::new(init.params),
                ports,
                inp: PassInputs::default(),
                out: PassOutput::default(),
                pages: Vec::new(),
                ranks: init.ranks,
            }),
            components: init.components,
            clock: init.clock,
            shared: init.shared,
            supervisor: init.supervisor,
            gpu: None,
            eos_token: init.eos_token,
            stat_interval: init.stat_interval,
            live: HashMap::default(),
            pending: PassInputs::default(),
            stepping: None,
            stepping_since: 0.0,
            spare_batch: Vec::new(),
            spare_rows: Vec::new(),
            spare_out: StepOutput::default(),
            last_step_back: None,
            pass_queued: false,
            poll_queued: false,
            last_step: None,
            retained: Vec::new(),
            kv: observe::KvCounts::default(),
            record: init.record.then(Vec::new),
            recorder: init.recorder,
            stopped: false,
            broken: false,
            idle_waiters: Vec::new(),
        }
    }

    /// Wakes the drain's waiters once no request is in flight.
    fn notify_if_idle(&mut self) {
        if self.live.is_empty() {
            for w in self.idle_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    fn gpu_send(&mut self, msg: GpuMsg) {
        let ok = self.gpu.as_ref().is_some_and(|g| g.send(msg));
        if !ok && !self.stopped {
            self.backend_down("the GPU-step actor is not running");
        }
    }

    /// Run a pass soon (once, however many events asked for it).
    fn kick(&mut self, ctx: &mut Context<Self>) {
        if self.stepping.is_none() && !self.pass_queued && !self.stopped && !self.broken {
            self.pass_queued = true;
            ctx.notify(RunPass);
        }
    }

    fn fail(&mut self, id: RequestId, message: &str) {
        if let Some(l) = self.live.remove(&id) {
            self.leave(id, &l, Outcome::Failed, self.clock.now(), Some(message));
            let _ = l.events.send(EngineEvent::Failed {
                message: message.to_owned(),
            });
            if l.waiting {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.pending.cancellations.push(id);
    }

    fn fail_all(&mut self, message: &str) {
        let mut ids: Vec<RequestId> = self.live.keys().copied().collect();
        ids.sort_unstable(); // the cancellations reach the pass in id order
        for id in ids {
            self.fail(id, message);
        }
    }

    fn backend_down(&mut self, why: &str) {
        self.go_down(why, format!("the step backend stopped: {why}"));
    }

    /// The worker cannot go on: new requests are refused with `why`, every in-flight one
    /// fails with `message`, and the supervisor turns preemption off.
    fn go_down(&mut self, why: &str, message: String) {
        self.shared.set_down(why);
        tracing::error!("{message}");
        self.supervisor.do_send(Disable {
            why: message.clone(),
        });
        self.fail_all(&message);
        self.stepping = None;
    }

    /// Start a pass: its state moves into the returned future, which sends the pass's
    /// messages to the component actors (`None` while another pass runs).
    fn start_pass(&mut self) -> Option<impl std::future::Future<Output = PassState> + 'static> {
        let mut st = self.state.take()?;
        self.pending.now = self.clock.now();
        std::mem::swap(&mut st.inp, &mut self.pending);
        let needs_pages = self.gpu.as_ref().is_none_or(|g| g.needs_pages);
        // The other ranks run the pass beside this one; a failure is read in `passed`.
        let _ = st.ranks.as_mut().map(|r| r.broadcast(&st.inp));
        Some(async move {
            st.machine.run(&mut st.ports, &st.inp, &mut st.out).await;
            if let Some(r) = st.ranks.as_mut() {
                let _ = r.check(&st.out).await;
            }
            let rows = if needs_pages { st.out.batch.len() } else { 0 };
            st.pages.clear();
            if !st.out.admitted.is_empty() || rows > 0 {
                let ids = st.out.admitted.iter().map(|a| a.id);
                let ids = ids.chain(st.out.batch[..rows].iter().map(|b| b.id));
                st.pages = st.ports.page_tables(ids).await;
            }
            st
        })
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        if let Some(f) = self.start_pass() {
            // Nothing else is handled until the pass is back: its state is out of `self`.
            ctx.wait(f.into_actor(self).map(|st, act, ctx| act.passed(st, ctx)));
        }
    }

    fn passed(&mut self, mut st: PassState, ctx: &mut Context<Self>) {
        self.shared.passes.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = self.record.as_mut() {
            r.push((st.inp.clone(), st.out.clone()));
        }
        st.inp.clear();
        let failure = (st.ports.failure())
            .map(|why| format!("a scheduling component stopped: {why}"))
            .or_else(|| st.ranks.as_ref()?.failure().map(ToString::to_string));
        match failure {
            Some(why) => {
                self.state = Some(st);
                if !self.broken {
                    self.broken = true;
                    self.go_down(&why, why.clone());
                }
            }
            None => {
                self.apply(&mut st, ctx);
                self.state = Some(st);
            }
        }
        self.notify_if_idle();
    }

    fn apply(&mut self, st: &mut PassState, ctx: &mut Context<Self>) {
        let out = &st.out;
        for id in &out.rejected {
            if let Some(l) = self.live.remove(id) {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                let why = "the waiting queue is full; request refused";
                self.leave(*id, &l, Outcome::Failed, out.now, Some(why));
                let _ = l.events.send(EngineEvent::Failed {
                    message: why.into(),
                });
            }
        }
        for id in &out.cancelled {
            if let Some(l) = self.live.remove(id) {
                if l.paused {
                    counter!(m::CANCELLED_WHILE_PAUSED_TOTAL).increment(1);
                }
                self.leave(*id, &l, Outcome::Cancelled, out.now, None);
                if l.waiting {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        // The departed leave the backend before this pass's arrivals reach it: an arrival
        // may take the sequence slot a departure has just freed, and the backend refuses a
        // slot that a request it still holds occupies.
        for d in &out.departed {
            self.gpu_send(GpuMsg::Release(Release(d.id)));
        }
        for (i, a) in out.admitted.iter().enumerate() {
            let Some(l) = self.live.get_mut(&a.id) else {
                continue;
            };
            l.waiting = false;
            l.admitted_at = Some(out.now);
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            histogram!(m::REQUEST_QUEUE_TIME_SECONDS).record((out.now - l.arrival).max(0.0));
            let arrival = ContextArrival {
                id: a.id,
                slot: a.slot,
                prompt: l.prompt.clone(),
                pages: st.pages.get_mut(i).map(std::mem::take).unwrap_or_default(),
                sampling: l.sampling,
                min_tokens: l.min_tokens,
            };
            self.gpu_send(GpuMsg::Admit(Admit(arrival)));
        }
        if !out.pauses.is_empty() {
            for id in &out.pauses {
                if let Some(l) = self.live.get_mut(id) {
                    l.paused = true;
                    l.pauses += 1;
                }
            }
            counter!(m::PAUSES_TOTAL).increment(out.pauses.len() as u64);
            self.gpu_send(GpuMsg::Pause(Pause(out.pauses.clone())));
        }
        if !out.resumes.is_empty() || !out.forced_resumes.is_empty() {
            counter!(m::RESUMES_TOTAL, m::LABEL_FORCED => m::FORCED_NO)
                .increment(out.resumes.len() as u64);
            counter!(m::RESUMES_TOTAL, m::LABEL_FORCED => m::FORCED_YES)
                .increment(out.forced_resumes.len() as u64);
            let ids = [out.resumes.as_slice(), out.forced_resumes.as_slice()].concat();
            for id in &ids {
                if let Some(l) = self.live.get_mut(id) {
                    l.paused = false;
                }
            }
            self.gpu_send(GpuMsg::Resume(Resume(ids)));
        }
        if !out.kv_waiting.is_empty() {
            counter!(m::KV_WAITS_TOTAL).increment(out.kv_waiting.len() as u64);
            self.kv.waits += out.kv_waiting.len() as u64;
        }
        let kept = (out.displaced.iter())
            .chain(&out.token_limited)
            .chain(&out.kv_waiting);
        if !kept.clone().eq(&self.retained) {
            self.retained.clear();
            self.retained.extend(kept);
            self.gpu_send(GpuMsg::Retain(Retain(self.retained.clone())));
        }
        for d in &out.departed {
            if out.kv_aborted.contains(&d.id) {
                if let Some(l) = self.live.remove(&d.id) {
                    counter!(m::KV_ABORTS_TOTAL).increment(1);
                    self.kv.aborts += 1;
                    let kv = &st.machine.params().kv;
                    let why = kv_stall::abort_message(kv.total_pages, kv.tokens_per_block);
                    self.leave(d.id, &l, Outcome::Failed, out.now, Some(&why));
                    let _ = l.events.send(EngineEvent::Failed { message: why });
                }
                continue;
            }
            if let Some(l) = self.live.remove(&d.id) {
                let reason = if l.stop {
                    FinishReason::Stop
                } else if d.completed {
                    FinishReason::Length
                } else {
                    FinishReason::Cancelled
                };
                let outcome = match reason {
                    FinishReason::Cancelled => Outcome::Cancelled,
                    _ => Outcome::Completed,
                };
                self.leave(d.id, &l, outcome, out.now, None);
                let _ = l.events.send(EngineEvent::Finished { reason });
            }
        }
        self.metrics(st.machine.resident_count(), out);
        let ended =
            !out.departed.is_empty() || !out.cancelled.is_empty() || !out.rejected.is_empty();
        if ended && st.machine.resident_count() == 0 && out.queue_len == 0 {
            // The last request left: the pool gauges show it now, not at the next reading.
            self.pool_metrics(ctx);
        }
        if !out.batch.is_empty() {
            let mut rows = std::mem::take(&mut self.spare_rows);
            rows.clear();
            // The batch's page tables follow the admissions' (none when not wanted).
            let mut pages = st.pages.iter_mut().skip(out.admitted.len());
            rows.extend(out.batch.iter().map(|b| StepRow {
                id: b.id,
                slot: b.slot,
                context_len: b.context_len,
                last_token: self.live.get(&b.id).map_or(0, |l| l.last_token),
                pages: pages.next().map(std::mem::take).unwrap_or_default(),
            }));
            self.stream_first_tokens(&out.batch);
            let mut batch = std::mem::take(&mut self.spare_batch);
            batch.clear();
            batch.extend_from_slice(&out.batch);
            self.stepping = Some((out.pass, batch));
            self.stepping_since = out.now;
            let out_buf = std::mem::take(&mut self.spare_out);
            if let Some(back) = self.last_step_back.take() {
                histogram!(m::STEP_GAP_SECONDS).record(back.elapsed().as_secs_f64());
            }
            self.gpu_send(GpuMsg::Step(Step {
                pass: out.pass,
                rows,
                out: out_buf,
            }));
        } else {
            // No step this pass: the time until the next one is idle, not a gap.
            self.last_step_back = None;
            if (st.machine.resident_count() > 0 || out.queue_len > 0)
                && !self.poll_queued
                && !self.stopped
            {
                self.poll_queued = true;
                ctx.run_later(POLL, |act, ctx| {
                    act.poll_queued = false;
                    act.kick(ctx);
                });
            }
        }
    }

    /// `serve --record`: hand the leaving request's line to the writer thread.
    fn leave(&self, id: RequestId, l: &Live, outcome: Outcome, at: f64, error: Option<&str>) {
        if let Some(r) = &self.recorder {
            r.record(Leaving {
                id,
                arrival_s: l.arrival,
                context_tokens: u32::try_from(l.prompt.len()).unwrap_or(u32::MAX),
                max_tokens: l.max_tokens,
                output_tokens: l.sent,
                admitted_s: l.admitted_at,
                kv_ready_s: l.kv_ready_at,
                first_token_s: l.first_token_at,
                finish_s: at,
                pauses: l.pauses,
                outcome,
                error,
            });
        }
    }

    /// SPEC §4.6: a request's first token is emitted when it is first scheduled. Where the
    /// backend gave it at arrival, the client gets it as the step starts, not with the
    /// step's own tokens one step later.
    fn stream_first_tokens(&mut self, batch: &[BatchRow]) {
        let now = self.record_now();
        for row in batch.iter().filter(|r| r.first_token) {
            let Some(l) = self.live.get_mut(&row.id) else {
                continue;
            };
            if let Some(t) = l.first_at_arrival.take() {
                l.stream(t, self.eos_token, now);
            }
        }
    }

    /// The time `--record` stamps a first token with; `None` without a recorder.
    fn record_now(&self) -> Option<f64> {
        self.recorder.is_some().then(|| self.clock.now())
    }

    /// Stream the step's tokens and queue its results for the next pass. The output's
    /// token vectors go back to the backend with the next step.
    fn stepped(&mut self, batch: &[BatchRow], out: StepOutput) {
        let now = self.record_now();
        for (row, tokens) in batch.iter().zip(&out.tokens) {
            let mut stop = false;
            if let Some(l) = self.live.get_mut(&row.id) {
                // A first step's tokens start with the first token: whatever was streamed
                // before this step (it, at scheduling) is not sent again.
                let skip = if row.first_token { l.sent as usize } else { 0 };
                for &t in tokens.iter().skip(skip) {
                    if !l.stream(t, self.eos_token, now) {
                        break;
                    }
                }
                stop = l.stop;
            }
            // The core counted the first token when it scheduled the request.
            let counted = if row.first_token {
                tokens.len().saturating_sub(1)
            } else {
                tokens.len()
            };
            self.pending
                .push_stepped(row.id, counted as u32, stop, tokens);
        }
        self.pending.step_s = Some(out.step_s);
        self.last_step = Some((out.step_s, batch.len()));
        self.spare_out = out;
    }
}

/// Attach the GPU-step actor (its thread needs the executor's address first).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct AttachGpu(pub GpuHandle);

#[derive(actix::Message)]
#[rtype(result = "()")]
struct RunPass;

impl Actor for Executor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(every) = self.stat_interval {
            ctx.run_interval(every, |act, ctx| act.stat_line(ctx));
        }
        self.pool_metrics(ctx);
        ctx.run_interval(POOL_METRICS, |act, ctx| act.pool_metrics(ctx));
    }
}

impl Handler<AttachGpu> for Executor {
    type Result = ();
    fn handle(&mut self, msg: AttachGpu, _: &mut Context<Self>) {
        self.gpu = Some(msg.0);
    }
}

impl Handler<RunPass> for Executor {
    type Result = ();
    fn handle(&mut self, _: RunPass, ctx: &mut Context<Self>) {
        self.pass_queued = false;
        if self.stepping.is_none() && !self.stopped {
            self.pass(ctx);
        }
    }
}

impl Handler<Submit> for Executor {
    type Result = ();
    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        if self.stopped {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            let _ = msg.events.send(EngineEvent::Failed {
                message: "the server is shutting down; request not accepted".into(),
            });
            return;
        }
        let context_tokens = u32::try_from(msg.req.prompt_tokens.len()).unwrap_or(u32::MAX);
        self.pending.arrivals.push(Arrival {
            id: msg.id,
            arrival: msg.arrival,
            context_tokens,
            max_tokens: msg.req.max_tokens.max(1),
        });
        self.live.insert(
            msg.id,
            Live {
                events: msg.events,
                arrival: msg.arrival,
                prompt: msg.req.prompt_tokens,
                max_tokens: msg.req.max_tokens.max(1),
                min_tokens: msg.req.min_tokens,
                ignore_eos: msg.req.ignore_eos,
                sampling: msg.req.sampling,
                sent: 0,
                last_token: 0,
                waiting: true,
                stop: false,
                first_at_arrival: None,
                admitted_at: None,
                kv_ready_at: None,
                first_token_at: None,
                paused: false,
                pauses: 0,
            },
        );
        self.kick(ctx);
    }
}

impl Handler<Cancel> for Executor {
    type Result = ();
    fn handle(&mut self, msg: Cancel, ctx: &mut Context<Self>) {
        let resident = self
            .state
            .as_ref()
            .is_some_and(|s| s.machine.is_resident(msg.0));
        if self.live.contains_key(&msg.0) || resident {
            self.pending.cancellations.push(msg.0);
            self.kick(ctx);
        }
    }
}

impl Handler<StepDone> for Executor {
    type Result = ();
    fn handle(&mut self, msg: StepDone, ctx: &mut Context<Self>) {
        self.step_done(msg, ctx);
    }
}

impl Executor {
    fn step_done(&mut self, msg: StepDone, ctx: &mut Context<Self>) {
        if self.spare_rows.capacity() < msg.rows.capacity() {
            self.spare_rows = msg.rows;
        }
        let Some((pass, batch)) = self.stepping.take() else {
            return; // a step of a batch already failed and released
        };
        if pass != msg.pass {
            self.stepping = Some((pass, batch));
            return;
        }
        match msg.result {
            Ok(out) if out.tokens.len() == batch.len() => {
                histogram!(m::STEP_SECONDS).record(out.step_s);
                self.last_step_back = Some(std::time::Instant::now());
                self.stepped(&batch, out)
            }
            Ok(out) => {
                let why = format!(
                    "the backend returned {} rows for a batch of {}",
                    out.tokens.len(),
                    batch.len()
                );
                self.fail_batch(&batch, &why);
            }
            Err(e) => self.fail_batch(&batch, &format!("decode step failed: {e}")),
        }
        self.spare_batch = batch;
        self.notify_if_idle();
        self.kick(ctx);
    }

    fn fail_batch(&mut self, batch: &[BatchRow], why: &str) {
        tracing::error!("{why}; failing the {} requests of the batch", batch.len());
        // The supervisor hears of it before any client does.
        self.supervisor.do_send(Disable {
            why: why.to_owned(),
        });
        for row in batch {
            self.fail(row.id, why);
        }
    }
}

impl Handler<KvArrived> for Executor {
    type Result = ();
    fn handle(&mut self, msg: KvArrived, ctx: &mut Context<Self>) {
        match msg.result {
            Ok(arrived) => {
                let at = self.clock.now();
                if let Some(l) = self.live.get_mut(&msg.id) {
                    l.first_at_arrival = arrived.first_token;
                    l.kv_ready_at = Some(at);
                    if let Some(a) = l.admitted_at {
                        histogram!(m::CONTEXT_ARRIVAL_SECONDS).record((at - a).max(0.0));
                    }
                }
                self.pending.kv_ready.push(KvReady { id: msg.id, at });
            }
            Err(e) => self.fail(msg.id, &format!("context arrival failed: {e}")),
        }
        self.notify_if_idle();
        self.kick(ctx);
    }
}

impl Handler<BackendDown> for Executor {
    type Result = ();
    fn handle(&mut self, msg: BackendDown, ctx: &mut Context<Self>) {
        self.backend_down(&msg.0);
        self.notify_if_idle();
        self.kick(ctx);
    }
}

impl Handler<DisablePreemption> for Executor {
    type Result = ();
    fn handle(&mut self, _: DisablePreemption, ctx: &mut Context<Self>) {
        // Ahead of the next pass's `Step` in the controller's mailbox, and in the next
        // pass's frame to the other ranks.
        self.components.disable_preemption();
        if let Some(r) = self.state.as_mut().and_then(|s| s.ranks.as_mut()) {
            r.disable_preemption();
        }
        self.kick(ctx);
    }
}

impl Handler<Shutdown> for Executor {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, msg: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.fail_all(&msg.reason);
        self.stepping = None;
        // One last pass releases every lease of the failed requests.
        let last = self.start_pass();
        Box::pin(
            async move {
                match last {
                    Some(f) => Some(f.await),
                    None => None,
                }
            }
            .into_actor(self)
            .map(|st, act, ctx| {
                if let Some(st) = st {
                    act.passed(st, ctx);
                }
                act.stopped = true;
                if let Some(g) = &act.gpu {
                    g.send(GpuMsg::Stop);
                }
                ctx.stop();
            }),
        )
    }
}

impl Handler<WaitIdle> for Executor {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: WaitIdle, _: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.idle_waiters.push(tx);
        self.notify_if_idle();
        Box::pin(
            async move {
                let _ = rx.await;
            }
            .into_actor(self),
        )
    }
}

impl Handler<TakeRecord> for Executor {
    type Result = MessageResult<TakeRecord>;
    fn handle(&mut self, _: TakeRecord, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.record.as_mut().map(std::mem::take).unwrap_or_default())
    }
}

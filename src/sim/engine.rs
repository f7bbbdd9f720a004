//! One simulated run: one arm, one seed. A discrete-event loop in virtual time around the
//! real `WorkerCore`: lanes issue requests (AgentX replay or open loop), context servers
//! prefill them, the worker admits, pauses, resumes and builds batches exactly as the
//! server does, and the step-time model advances the clock.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::policy::admission::AdmissionParams;
use crate::policy::preemption::paused_cap;
use crate::policy::setup::{self, SetupInputs};
use crate::policy::{AdmissionPolicy, Mode};
use crate::pools::PoolReport;
use crate::worker::{Arrival, KvReady, PassInputs, PassOutput, Stepped, WorkerCore, WorkerParams};
use crate::workload::{
    AgentxReplay, Issue, OpenLoopReplay, OpenLoopRules, PrefixHashes, Replay, ReplayRules,
    SendJitter, Session, TimedRequest,
};

use super::arm::ArmSpec;
use super::pages;
use super::plant::Plant;
use super::requests::Requests;
use super::tokens::StepTokens;

/// Where the requests come from.
#[derive(Debug, Clone)]
pub enum Workload {
    /// Closed-loop AgentX lanes over these sessions.
    Sessions(Arc<[Session]>),
    /// Open loop by timestamp, rate scaled.
    Timed(Arc<[TimedRequest]>, f64),
    /// Recorded served traffic (`serve --record`), open loop at the recorded arrivals. These
    /// are arrivals at the GEN worker, so they skip the context servers: each reaches the
    /// worker at its recorded time, and the KV transfer follows its admission as usual. The
    /// flags say which of them the served run completed: only those are measured, so the
    /// simulated latencies and throughput cover the requests the served ones do (a run's
    /// end cancels the longest of its requests in flight, which would bias any other set).
    Recorded(Arc<[TimedRequest]>, Arc<[bool]>),
}

/// Everything one run needs besides the arm.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub plant: Plant,
    pub admission: AdmissionParams,
    pub workload: Workload,
    pub concurrency: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub seed: u64,
}

/// An arm with its target resolved.
#[derive(Debug, Clone)]
pub struct ResolvedArm {
    pub spec: ArmSpec,
    pub mode: Mode,
}

/// One measured request.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Record {
    /// When it was sent, simulated seconds from the run's start (its first sends): a
    /// recording's `arrival_s` less its first arrival, the clock `sim --replay` windows it on.
    pub sent_s: f64,
    pub ttft_s: f64,
    pub e2e_s: f64,
    /// `None` for single-token outputs.
    pub tpot_s: Option<f64>,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub decode_s: f64,
    /// Of the TTFT: the wait for a slot (arrival as the scheduler sees it → admission), and
    /// the context's arrival (admission → KV ready); the rest is the wait for the first pass.
    pub queue_s: f64,
    pub context_s: f64,
}

#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub records: Vec<Record>,
    pub pauses: u64,
    pub resumes: u64,
    pub forced_resumes: u64,
    pub displaced: u64,
    /// Measured requests that had not finished when the run stopped.
    pub unfinished: u64,
    /// Measured requests aborted because the KV pool stalled the worker (`policy::kv_stall`).
    pub kv_aborts: u64,
    pub passes: u64,
    pub events: u64,
    pub simulated_s: f64,
    /// Mean decode batch over the measurement window.
    pub mean_batch: f64,
    pub mean_step_s: f64,
    pub setup_warning: Option<String>,
    /// Mean paused count over the window's passes, and the controller's state at the end.
    pub mean_paused: f64,
    pub final_g: Option<f64>,
    pub final_x_s: Option<f64>,
    pub final_d_s: Option<f64>,
    /// Every pass's decisions (only when asked for; used by equivalence tests).
    pub trace: Vec<PassOutput>,
    /// Every issued request (only when asked for): what each arm was offered.
    pub issued: Vec<Issued>,
    /// The controller's state every 30 simulated seconds.
    pub timeline: Vec<super::timeline::TimelinePoint>,
}

/// One request the workload issued, for checking that arms see the same workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Issued {
    pub send_at: f64,
    pub lane: Option<usize>,
    pub session: usize,
    pub instance: u64,
    pub input_tokens: u32,
    pub max_tokens: u32,
    pub warmup: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    CtxDone(u64),
    /// A recorded arrival reaches the worker directly.
    Arrive(u64),
    KvReady(u64),
    Step,
    /// Re-run a pass while nothing steps but the worker is not idle (transfers, pauses).
    Poll,
}

#[derive(Debug, Clone, Copy)]
struct Timed {
    at: f64,
    seq: u64,
    ev: Ev,
}
impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Clone)]
struct Req {
    sent: f64,
    /// Closed loop: the lane that sent it (its completion draws the lane's send jitter).
    lane: Option<usize>,
    input: u32,
    max_tokens: u32,
    measured: bool,
    first: Option<f64>,
    admitted: f64,
    kv_ready: f64,
}

/// Builds the worker for an arm: the same setup decision and sizing as the server, with KV
/// pages as large as provably change no decision (see `pages`).
pub fn worker_params(spec: &RunSpec, arm: &ResolvedArm) -> (WorkerParams, Option<String>) {
    params_with(spec, arm, true)
}

fn params_with(
    spec: &RunSpec,
    arm: &ResolvedArm,
    large_pages: bool,
) -> (WorkerParams, Option<String>) {
    let max_batch = arm.spec.max_batch_size.unwrap_or(spec.plant.max_batch_size);
    let max_active = arm.spec.max_active.unwrap_or(max_batch);
    let mut admission = spec.admission;
    if let Some(order) = arm.spec.order {
        admission.policy = order;
    }
    let tpb = 32u64;
    let decision = setup::decide(
        &SetupInputs {
            mode: arm.mode,
            // Ablations run preemption under any pop order; fcfs still never forms X.
            policy: AdmissionPolicy::Auto,
            pipeline_parallel_size: 1,
            enable_attention_dp: false,
            max_active,
        },
        |h| {
            vec![PoolReport {
                pool: "kv",
                resident_capacity: ((max_active + h) as u64).min(spec.plant.kv_tokens / tpb),
            }]
        },
    );
    let (mode, headroom, warning) = match decision {
        Ok(d) => (d.mode, d.headroom, d.warning.map(|w| w.message())),
        Err(e) => (Mode::Off, 0, Some(e.to_string())),
    };
    debug_assert!(headroom == 0 || headroom == paused_cap(max_active));
    let mut p = WorkerParams::simple(max_batch, mode, headroom, spec.plant.kv_tokens);
    p.max_active = max_active;
    p.kv.index_rows = max_active + headroom;
    p.admission = admission;
    p.tokens_per_step = spec.plant.step.tokens_per_step.ceil().max(1.0) as u32;
    p.max_num_tokens = p.max_num_tokens.max(max_batch * p.tokens_per_step);
    if let Some(v) = arm.spec.victim {
        p.victim_key = v;
    }
    if let Some(g0) = arm.spec.g0 {
        p.g0 = g0;
    }
    p.gain_from = arm.spec.gain_from.unwrap_or_default();
    if let Some(n) = arm.spec.pauses {
        p.pause_limits.budget = n;
    }
    if large_pages {
        let max_req =
            pages::max_request_tokens(&spec.workload, spec.plant.output_scale, p.tokens_per_step);
        let page = pages::page_tokens(spec.plant.kv_tokens, p.kv.index_rows, max_req);
        p.kv.tokens_per_block = page;
        p.kv.total_pages = (spec.plant.kv_tokens / u64::from(page)).min(u64::from(u32::MAX)) as u32;
    }
    (p, warning)
}

fn replay_for(spec: &RunSpec) -> Result<Box<dyn Replay>, String> {
    match &spec.workload {
        Workload::Sessions(s) => {
            let rules = ReplayRules {
                concurrency: spec.concurrency,
                start_fraction: spec.plant.start_fraction,
                idle_cap_s: spec.plant.idle_cap_s,
                warmup: true,
            };
            AgentxReplay::new(s.clone(), rules, spec.seed)
                .map(|r| Box::new(r) as Box<dyn Replay>)
                .map_err(|e| e.to_string())
        }
        Workload::Timed(t, scale) => {
            let rules = OpenLoopRules {
                scale: *scale,
                ..OpenLoopRules::default()
            };
            OpenLoopReplay::new(t.clone(), rules)
                .map(|r| Box::new(r) as Box<dyn Replay>)
                .map_err(|e| e.to_string())
        }
        Workload::Recorded(t, _) => OpenLoopReplay::new(t.clone(), OpenLoopRules::default())
            .map(|r| Box::new(r) as Box<dyn Replay>)
            .map_err(|e| e.to_string()),
    }
}

/// Tokens already cached on the context servers: the longest common prefix (in blocks) with
/// the previous prompt of the same session instance and depth.
fn uncached_tokens(cache: &mut HashMap<(u64, u32), PrefixHashes>, is: &Issue) -> u32 {
    if is.block_size == 0 || is.hash_ids.is_empty() {
        return is.input_tokens;
    }
    let key = (is.instance, is.depth);
    let lcp = cache
        .get(&key)
        .map_or(0, |prev| prev.common_prefix_len(&is.hash_ids));
    cache.insert(key, is.hash_ids.clone());
    is.input_tokens
        .saturating_sub((lcp as u64 * is.block_size as u64).min(u32::MAX as u64) as u32)
}

/// Run one arm for one seed. `keep_trace` records every pass's decisions.
pub fn run(spec: &RunSpec, arm: &ResolvedArm, keep_trace: bool) -> Result<RunResult, String> {
    run_with(spec, arm, keep_trace, true)
}

fn run_with(
    spec: &RunSpec,
    arm: &ResolvedArm,
    keep_trace: bool,
    large_pages: bool,
) -> Result<RunResult, String> {
    let (params, warning) = params_with(spec, arm, large_pages);
    let mut worker = WorkerCore::new(params);
    let mut replay = replay_for(spec)?;
    let plant = &spec.plant;
    let hard_end = spec.duration_s + 1800.0;

    let mut heap: BinaryHeap<Timed> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Timed>, at: f64, ev: Ev| {
        seq += 1;
        heap.push(Timed { at, seq, ev });
    };
    let mut reqs: Requests<Req> = Requests::default();
    let mut tokens = StepTokens::new(plant.step.tokens_per_step);
    let mut ctx_free = plant.context.servers.max(1);
    let mut ctx_queue: VecDeque<(u64, u32)> = VecDeque::new();
    let mut prefix: HashMap<(u64, u32), PrefixHashes> = HashMap::new();
    let direct = matches!(spec.workload, Workload::Recorded(..));
    // Open loop, an issue's `session` is its index in the trace.
    let served_completed = |i: usize| match &spec.workload {
        Workload::Recorded(_, completed) => completed.get(i).copied().unwrap_or(true),
        _ => true,
    };

    let mut pending = PassInputs::default();
    // The pass's decisions; its buffers are reused by the next pass.
    let mut o = crate::worker::PassOutput::default();
    let mut stepping = false;
    let mut poll_pending = false;
    let mut captured = false;
    let mut measured_open = 0u64;
    let mut out = RunResult {
        setup_warning: warning,
        ..RunResult::default()
    };
    let (mut batch_sum, mut step_sum, mut window_steps) = (0.0f64, 0.0f64, 0u64);
    let (mut paused_sum, mut window_passes) = (0.0f64, 0u64);
    let mut timeline = super::timeline::Recorder::new();
    // A lane's next send waits its seeded jitter after each completion, as loadgen's do.
    let mut jitter = SendJitter::new(Duration::from_secs_f64(plant.send_jitter_s), spec.seed);
    let mut lane_ready = |lane: Option<usize>, now: f64| now + lane.map_or(0.0, |l| jitter.next(l));

    replay.start(0.0);
    let mut now = 0.0f64;
    loop {
        let next_ev = heap.peek().map(|t| t.at);
        // Lanes keep issuing (unmeasured) after the window so the measured requests finish
        // under the same load.
        let next_issue = replay.next_due().filter(|t| *t < hard_end);
        let t = match (next_ev, next_issue) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (Some(a), Some(b)) => a.min(b),
        };
        if t > hard_end || (measured_open == 0 && now >= spec.duration_s) {
            break;
        }
        now = t;
        out.events += 1;
        let wake_worker;
        if next_issue.is_some_and(|b| b <= now) {
            for is in replay.pop_due(now) {
                let measured = !is.warmup
                    && is.send_at >= spec.warmup_s
                    && is.send_at < spec.duration_s
                    && served_completed(is.session);
                measured_open += measured as u64;
                if keep_trace {
                    out.issued.push(Issued {
                        send_at: is.send_at,
                        lane: is.lane,
                        session: is.session,
                        instance: is.instance,
                        input_tokens: is.input_tokens,
                        max_tokens: is.max_tokens,
                        warmup: is.warmup,
                    });
                }
                let u = uncached_tokens(&mut prefix, &is);
                reqs.insert(
                    is.id,
                    Req {
                        sent: is.send_at,
                        lane: is.lane,
                        input: is.input_tokens,
                        max_tokens: ((is.max_tokens as f64 * plant.output_scale).round() as u32)
                            .max(1),
                        measured,
                        first: None,
                        admitted: is.send_at,
                        kv_ready: is.send_at,
                    },
                )?;
                if direct {
                    push(&mut heap, now, Ev::Arrive(is.id));
                } else if ctx_free > 0 {
                    ctx_free -= 1;
                    push(
                        &mut heap,
                        now + plant.context.prefill_s(u),
                        Ev::CtxDone(is.id),
                    );
                } else {
                    ctx_queue.push_back((is.id, u));
                }
            }
            continue;
        }
        let Some(Timed { ev, .. }) = heap.pop() else {
            break;
        };
        match ev {
            Ev::CtxDone(id) => {
                if let Some((next, u)) = ctx_queue.pop_front() {
                    push(
                        &mut heap,
                        now + plant.context.prefill_s(u),
                        Ev::CtxDone(next),
                    );
                } else {
                    ctx_free += 1;
                }
                if let Some(r) = reqs.get(id) {
                    pending.arrivals.push(Arrival {
                        id,
                        arrival: r.sent,
                        context_tokens: r.input,
                        max_tokens: r.max_tokens,
                    });
                }
                wake_worker = !stepping;
            }
            Ev::Arrive(id) => {
                if let Some(r) = reqs.get(id) {
                    pending.arrivals.push(Arrival {
                        id,
                        arrival: r.sent,
                        context_tokens: r.input,
                        max_tokens: r.max_tokens,
                    });
                }
                wake_worker = !stepping;
            }
            Ev::KvReady(id) => {
                if let Some(r) = reqs.get_mut(id) {
                    r.kv_ready = now;
                }
                pending.kv_ready.push(KvReady { id, at: now });
                wake_worker = !stepping;
            }
            Ev::Step => {
                stepping = false;
                wake_worker = true;
            }
            Ev::Poll => {
                poll_pending = false;
                wake_worker = !stepping;
            }
        }
        if !wake_worker {
            continue;
        }
        // A pass, then the step it schedules.
        pending.now = now;
        worker.pass_into(&pending, &mut o);
        // The step rows are kept and rewritten in place below: the simulator never sets
        // `stop` or token ids, and rebuilding every row was a measurable share of the run.
        let rows = std::mem::take(&mut pending.stepped);
        pending.clear();
        pending.stepped = rows;
        out.passes += 1;
        timeline.pass(&o, &worker);
        let in_window = now >= spec.warmup_s && now < spec.duration_s;
        if !captured && now >= spec.duration_s {
            // The controller's state at the end of the measured window (not after the drain).
            captured = true;
            out.final_g = worker.preemption().g();
            out.final_x_s = worker.queue().target();
            out.final_d_s = worker.preemption().d();
        }
        if in_window {
            out.pauses += o.pauses.len() as u64;
            out.resumes += o.resumes.len() as u64;
            out.forced_resumes += o.forced_resumes.len() as u64;
            out.displaced += o.displaced.len() as u64;
            paused_sum += o.paused as f64;
            window_passes += 1;
        }
        for a in &o.admitted {
            tokens.admit(a.slot, a.id);
            if let Some(r) = reqs.get_mut(a.id) {
                r.admitted = now;
            }
            push(
                &mut heap,
                now + plant.transfer.transfer_s(a.context_tokens),
                Ev::KvReady(a.id),
            );
        }
        for id in &o.rejected {
            // Queue full: the request fails; its lane moves on.
            let lane = reqs.remove(*id).and_then(|r| {
                measured_open -= r.measured as u64;
                r.lane
            });
            let _ = replay.on_complete(*id, lane_ready(lane, now));
        }
        for f in &o.first_tokens {
            if let Some(r) = reqs.get_mut(f.id) {
                r.first = Some(now);
            }
        }
        for d in &o.departed {
            let removed = reqs.remove(d.id);
            let measured = removed.as_ref().filter(|r| r.measured);
            if measured.is_some() && o.kv_aborted.contains(&d.id) {
                // Failed, as its client sees it: no record (its lane moves on below).
                measured_open -= 1;
                out.kv_aborts += 1;
            } else if let Some(r) = measured {
                measured_open -= 1;
                let first = r.first.unwrap_or(now);
                let decode = now - first;
                out.records.push(Record {
                    sent_s: r.sent,
                    ttft_s: first - r.sent,
                    e2e_s: now - r.sent,
                    tpot_s: (d.output_tokens > 1).then(|| decode / (d.output_tokens - 1) as f64),
                    input_tokens: r.input,
                    output_tokens: d.output_tokens,
                    decode_s: decode,
                    queue_s: r.admitted - r.sent,
                    context_s: r.kv_ready - r.admitted,
                });
            }
            let lane = removed.and_then(|r| r.lane);
            let _ = replay.on_complete(d.id, lane_ready(lane, now));
        }
        if !o.batch.is_empty() {
            pending.stepped.resize_with(o.batch.len(), Stepped::default);
            let kv = tokens.step_rows(&o.batch, &mut pending.stepped);
            let step = plant.step.step_s(o.batch.len(), kv);
            if in_window {
                batch_sum += o.batch.len() as f64;
                step_sum += step;
                window_steps += 1;
            }
            pending.step_s = Some(step);
            push(&mut heap, now + step, Ev::Step);
            stepping = true;
        } else {
            // The next pass follows no step.
            pending.stepped.clear();
            if !worker.is_idle() && !poll_pending {
                poll_pending = true;
                // Nothing to step, but residents or waiters remain (in transfer, paused): poll.
                push(
                    &mut heap,
                    now + plant.step.step_s(0, 0).max(0.005),
                    Ev::Poll,
                );
            }
        }
        if keep_trace {
            out.trace.push(o.clone());
        }
    }
    out.unfinished = measured_open;
    out.timeline = timeline.finish();
    out.mean_paused = if window_passes > 0 {
        paused_sum / window_passes as f64
    } else {
        0.0
    };
    if !captured {
        out.final_g = worker.preemption().g();
        out.final_x_s = worker.queue().target();
        out.final_d_s = worker.preemption().d();
    }
    out.simulated_s = now;
    out.mean_batch = if window_steps > 0 {
        batch_sum / window_steps as f64
    } else {
        0.0
    };
    out.mean_step_s = if window_steps > 0 {
        step_sum / window_steps as f64
    } else {
        0.0
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::presets;
    use crate::workload::{SynthParams, SyntheticAgentic};

    fn spec() -> RunSpec {
        let mut plant = presets::reference();
        plant.max_batch_size = 8;
        plant.output_scale = 1.0;
        RunSpec {
            plant,
            admission: AdmissionParams {
                min_samples: 10,
                target_window: 100,
                ..AdmissionParams::default()
            },
            workload: Workload::Sessions(Arc::from(
                SyntheticAgentic::new(SynthParams::default()).generate(60, 11),
            )),
            concurrency: 24,
            duration_s: 400.0,
            warmup_s: 50.0,
            seed: 3,
        }
    }

    /// An open-loop trace: `n` requests, one every `gap` seconds.
    fn timed(n: usize, gap: f64) -> Arc<[TimedRequest]> {
        (0..n)
            .map(|i| TimedRequest {
                t: i as f64 * gap,
                input_tokens: 2000 + 37 * (i as u32 % 11),
                output_tokens: 50 + 13 * (i as u32 % 7),
                hash_ids: Default::default(),
                block_size: 0,
            })
            .collect()
    }

    /// The seed only places closed-loop lanes: open loop, every seed is the same run (what
    /// the CLI's header says of open-loop seeds).
    #[test]
    fn open_loop_runs_are_the_same_for_every_seed_and_closed_loop_runs_are_not() {
        let arm = ResolvedArm {
            spec: ArmSpec::control(),
            mode: Mode::TpotBudget(0.1),
        };
        let at = |workload: Workload, seed: u64| {
            let spec = RunSpec {
                workload,
                seed,
                ..spec()
            };
            run(&spec, &arm, true).unwrap()
        };
        let trace = timed(400, 0.5);
        let first = at(Workload::Timed(trace.clone(), 1.0), 0);
        assert!(first.records.len() > 100);
        for seed in [1, 7, 12345] {
            let other = at(Workload::Timed(trace.clone(), 1.0), seed);
            assert_eq!(other.records, first.records, "seed {seed}");
            assert_eq!(other.trace, first.trace, "seed {seed}");
        }
        let sessions = spec().workload;
        assert_ne!(at(sessions.clone(), 0).records, at(sessions, 1).records);
    }

    /// `--send-jitter`: after each completion a lane waits loadgen's draw for that completion
    /// (its seed, its lane, its count) on top of everything else, and sends the same requests.
    #[test]
    fn a_lanes_next_send_waits_loadgens_jitter_draw_for_its_nth_completion() {
        // No sub-agents: one lane's requests run one at a time, so each send follows the
        // completion before it and the two runs differ by the draws alone.
        let sessions: Arc<[Session]> = Arc::from(
            SyntheticAgentic::new(SynthParams {
                spawn_prob: 0.0,
                ..SynthParams::default()
            })
            .generate(20, 5),
        );
        let arm = ResolvedArm {
            spec: ArmSpec::control(),
            mode: Mode::Off,
        };
        let base = RunSpec {
            workload: Workload::Sessions(sessions),
            concurrency: 1,
            duration_s: 600.0,
            warmup_s: 0.0,
            ..spec()
        };
        let sends = |jitter_s: f64| {
            let mut spec = base.clone();
            spec.plant.send_jitter_s = jitter_s;
            run(&spec, &arm, true).unwrap().issued
        };
        let plain = sends(0.0);
        let jittered = sends(0.040);
        let n = plain.len().min(jittered.len());
        assert!(n > 20, "{n} sends");
        let what = |i: &Issued| (i.lane, i.session, i.instance, i.input_tokens, i.max_tokens);
        let mut moved = 0;
        for k in 1..n {
            assert_eq!(what(&jittered[k]), what(&plain[k]), "send {k}");
            let extra = (jittered[k].send_at - jittered[k - 1].send_at)
                - (plain[k].send_at - plain[k - 1].send_at);
            let draw = SendJitter::draw(Duration::from_millis(40), base.seed, 0, k as u64 - 1);
            assert!(
                (extra - draw).abs() < 1e-9,
                "send {k}: {extra} s more, drawn {draw}"
            );
            moved += usize::from(draw > 0.0);
        }
        assert!(moved > n / 2);
    }

    #[test]
    fn large_pages_make_every_decision_the_server_pages_make() {
        let spec = spec();
        for mode in [Mode::Off, Mode::TpotBudget(0.1)] {
            let arm = ResolvedArm {
                spec: ArmSpec::control(),
                mode,
            };
            let (large, _) = params_with(&spec, &arm, true);
            let (server, _) = params_with(&spec, &arm, false);
            assert!(large.kv.tokens_per_block > server.kv.tokens_per_block);
            let a = run_with(&spec, &arm, true, true).unwrap();
            let b = run_with(&spec, &arm, true, false).unwrap();
            assert!(a.trace.iter().any(|o| !o.admitted.is_empty()));
            assert_eq!(a.trace, b.trace, "{mode:?}");
            assert_eq!(a.records, b.records, "{mode:?}");
        }
    }

    #[test]
    fn a_pool_that_can_fill_keeps_the_server_pages() {
        let mut spec = spec();
        // 8 rows of the synthetic workload's largest requests do not fit in 1M tokens.
        spec.plant.kv_tokens = 1_000_000;
        let arm = ResolvedArm {
            spec: ArmSpec::control(),
            mode: Mode::Off,
        };
        let (p, _) = worker_params(&spec, &arm);
        assert_eq!(p.kv.tokens_per_block, pages::SERVER_PAGE_TOKENS);
        assert_eq!(p.kv.total_pages, 1_000_000 / pages::SERVER_PAGE_TOKENS);
    }

    #[test]
    fn a_records_ttft_splits_into_its_queue_wait_its_transfer_and_the_wait_for_a_pass() {
        let spec = spec();
        let arm = ResolvedArm {
            spec: ArmSpec::control(),
            mode: Mode::Off,
        };
        let out = run(&spec, &arm, false).unwrap();
        // Eight rows for 24 lanes: requests queue.
        assert!(out.records.iter().any(|r| r.queue_s > 1.0));
        // The longest step: a full batch, every row at the longest context seen.
        let longest = out
            .records
            .iter()
            .map(|r| u64::from(r.input_tokens + r.output_tokens))
            .max()
            .unwrap();
        let rows = spec.plant.max_batch_size as usize;
        let step = spec.plant.step.step_s(rows, rows as u64 * longest);
        for r in &out.records {
            let transfer = spec.plant.transfer.transfer_s(r.input_tokens);
            assert!(r.queue_s >= 0.0, "{r:?}");
            assert!((r.context_s - transfer).abs() < 1e-9, "{r:?}");
            // The pass after the KV arrives: at most the step in flight away.
            let rest = r.ttft_s - r.queue_s - r.context_s;
            assert!(rest >= -1e-9 && rest <= step + 1e-9, "{r:?} {step}");
        }
    }
}

use super::*;
use crate::policy::admission::{AdmissionParams, AdmissionQueue, Waiter};

const MAX: u32 = 4;

/// A queue with X formed at `x` and one waiter that arrived at `arrival`.
fn queue_with_waiter(x: f64, arrival: Option<f64>, now: f64, d: Option<f64>) -> AdmissionQueue {
    let mut q = AdmissionQueue::new(AdmissionParams {
        min_samples: 1,
        ..AdmissionParams::default()
    });
    q.observe_ttft(x);
    if let Some(a) = arrival {
        q.push(Waiter {
            id: 1000,
            arrival: a,
            context_tokens: 100,
            max_tokens: 100,
        })
        .unwrap();
    }
    q.refresh(now, d);
    q
}

fn res(id: u64, admit: f64, ft: f64, out: u32, iters: u32, max: u32) -> Resident {
    Resident {
        id,
        arrival: admit - 1.0,
        admit_time: admit,
        first_token_time: Some(ft),
        output_tokens: out,
        decode_iters: iters,
        max_tokens: max,
    }
}

/// Four long-running decoders admitted at 0..3 s, eligible at now = 100.
fn full_house() -> Vec<Resident> {
    (0..MAX as u64)
        .map(|i| res(i, i as f64, i as f64 + 0.5, 1000, 1000, 100_000))
        .collect()
}

/// The controller after completions with a mean decode time of `d` seconds (before X formed,
/// so g and the credit have not moved).
fn with_d(mut p: GenPreemption, d: f64) -> GenPreemption {
    p.stats.decode.push(d);
    p.stats.completions += 1;
    p
}

/// D used by the `tpot_budget` tests: W₀ = 0.15 D = 3 s, so W = 3 s at g = 1; minimum decode
/// 0.07 D = 1.4 s; maximum pause 0.35 D = 7 s.
const D: f64 = 20.0;

fn tpot_with(max_active: u32) -> GenPreemption {
    with_d(
        GenPreemption::new(PreemptParams::new(Mode::TpotBudget(0.1), max_active)),
        D,
    )
}

fn tpot() -> GenPreemption {
    tpot_with(MAX)
}

fn step(
    p: &mut GenPreemption,
    now: f64,
    residents: &[Resident],
    departed: &[Departure],
    q: &AdmissionQueue,
) -> PreemptDecision {
    p.step(&StepView {
        now,
        residents,
        by_admission: None,
        departed,
        queue: q.facts(),
        kv: KvRoom::UNBOUNDED,
    })
}

fn late_queue(now: f64) -> AdmissionQueue {
    // X = 1 s; the waiter arrived 10 s ago: late by 9 s.
    queue_with_waiter(1.0, Some(now - 10.0), now, None)
}

/// A head at risk in both modes: X = 1 s, arrived 2 s ago, late by 1 s, inside W = 3 s.
fn risk_queue(now: f64) -> AdmissionQueue {
    queue_with_waiter(1.0, Some(now - 2.0), now, None)
}

#[test]
fn pauses_only_when_full_and_the_head_is_at_risk() {
    let now = 100.0;
    let mut p = tpot();
    let rs = full_house();
    // Not full: a free slot admits the waiter instead.
    let d = step(&mut p, now, &rs[..3], &[], &risk_queue(now));
    assert!(d.pauses.is_empty());
    assert_eq!(d.admission_count, 3);
    // Full but nobody waiting.
    let d = step(
        &mut p,
        now,
        &rs,
        &[],
        &queue_with_waiter(1.0, None, now, None),
    );
    assert!(d.pauses.is_empty());
    // Full, head on time (arrived now, X = 100 s): no pause.
    let d = step(
        &mut p,
        now,
        &rs,
        &[],
        &queue_with_waiter(100.0, Some(now), now, None),
    );
    assert!(d.pauses.is_empty());
    // Full and the head is late by less than W: one pause, one slot for the waiter.
    let d = step(&mut p, now, &rs, &[], &risk_queue(now));
    assert_eq!(d.pauses.len(), 1);
    assert_eq!(d.admission_count, MAX - 1);
}

/// A pause keeps its victim's pages and admits the head: only when the KV pool can still let
/// every resident and the head finish (their contexts and `max_tokens`), in either mode.
#[test]
fn a_pause_needs_the_kv_pool_to_hold_every_resident_and_the_head_to_finish() {
    let now = 100.0;
    let q = risk_queue(now);
    let room = |committed| KvRoom {
        committed_pages: committed,
        head_pages: Some(40),
        total_pages: 1000,
    };
    let target = with_d(
        GenPreemption::new(PreemptParams::new(Mode::TargetOutputTps(5.0), MAX)),
        D,
    );
    for mut p in [tpot(), target] {
        let mut at = |kv: KvRoom| {
            p.step(&StepView {
                now,
                residents: &full_house(),
                by_admission: None,
                departed: &[],
                queue: q.facts(),
                kv,
            })
        };
        let d = at(room(961));
        assert!(d.pauses.is_empty(), "one page short: no pause");
        assert_eq!(d.admission_count, MAX);
        let d = at(room(960));
        assert_eq!(d.pauses.len(), 1, "exactly full: the pause goes ahead");
        assert_eq!(d.admission_count, MAX - 1);
    }
}

#[test]
fn tpot_budget_head_late_by_more_than_w_triggers_no_pause_one_late_by_less_does() {
    let now = 100.0;
    let w = tpot().window();
    assert!((w - 3.0).abs() < 1e-12);
    // X = 1 s, the head arrived 1 + w + 0.5 s ago: late by w + 0.5.
    let overdue = queue_with_waiter(1.0, Some(now - 1.0 - w - 0.5), now, None);
    let d = step(&mut tpot(), now, &full_house(), &[], &overdue);
    assert!(
        d.pauses.is_empty(),
        "late by more than W: the overdue tier serves it"
    );
    let late = queue_with_waiter(1.0, Some(now - 1.0 - w + 0.5), now, None);
    let d = step(&mut tpot(), now, &full_house(), &[], &late);
    assert_eq!(d.pauses.len(), 1, "late by less than W: a pause admits it");
}

#[test]
fn target_output_tps_pauses_for_a_head_late_by_far_more_than_w() {
    let now = 100.0;
    let mut p = with_d(
        GenPreemption::new(PreemptParams::new(Mode::TargetOutputTps(5.0), MAX)),
        D,
    );
    // Late by 9 s against W = 3 s: still at risk in target mode.
    let d = step(&mut p, now, &full_house(), &[], &late_queue(now));
    assert_eq!(d.pauses.len(), 1);
}

#[test]
fn no_pause_before_the_target_forms() {
    let now = 100.0;
    let mut p = tpot();
    let mut q = AdmissionQueue::new(AdmissionParams {
        min_samples: 5,
        ..AdmissionParams::default()
    });
    q.push(Waiter {
        id: 9,
        arrival: 0.0,
        context_tokens: 1,
        max_tokens: 1,
    })
    .unwrap();
    q.refresh(now, None);
    let d = step(&mut p, now, &full_house(), &[], &q);
    assert!(d.pauses.is_empty());
}

#[test]
fn tpot_budget_victim_is_the_longest_resident_ties_newest_arrival() {
    let now = 100.0;
    let mut rs = full_house();
    // Requests 0 and 1 admitted at the same time; 1 arrived later (newer).
    rs[1].admit_time = 0.0;
    rs[1].arrival = 0.5;
    rs[0].arrival = -1.0;
    let mut p = tpot();
    let d = step(&mut p, now, &rs, &[], &risk_queue(now));
    assert_eq!(d.pauses, vec![1]);
}

/// The residents' places oldest admission first (ties by id), as the worker's table keeps
/// them.
fn places_by_admission(rs: &[Resident]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..rs.len() as u32).collect();
    order.sort_by(|&a, &b| admission_order(&rs[a as usize], &rs[b as usize]));
    order
}

#[test]
fn victims_need_first_token_minimum_decode_and_not_near_finished() {
    let now = 100.0;
    let mut p = tpot();
    let mut rs = full_house();
    rs[0].first_token_time = None; // no first token yet
    rs[1].first_token_time = Some(now - 1.0); // decoding 1 s < 0.07 D = 1.4 s minimum
    rs[2].output_tokens = rs[2].max_tokens - 1; // near finished
    let d = step(&mut p, now, &rs, &[], &risk_queue(now));
    assert_eq!(d.pauses, vec![3]);
}

#[test]
fn near_finished_uses_remaining_tokens_times_own_tpot_against_min_decode() {
    let el = victim::Eligibility {
        now: 10.0,
        min_decode_s: 2.0,
        fallback_tpot: 0.05,
    };
    let r = res(1, 0.0, 0.0, 101, 100, 150); // own TPOT 0.1 s, 49 left → 4.9 s
    assert!(!el.near_finished(&r, 10.0));
    let r = res(1, 0.0, 0.0, 101, 100, 115); // 14 left → 1.4 s < 2 s
    assert!(el.near_finished(&r, 10.0));
}

#[test]
fn at_most_one_pause_per_pass_and_never_over_the_cap() {
    let now = 100.0;
    let mut p = tpot_with(8);
    assert_eq!(p.paused_cap(), 3);
    let rs: Vec<_> = (0..8)
        .map(|i| res(i, i as f64, i as f64 + 0.5, 1000, 1000, 100_000))
        .collect();
    let mut paused = 0;
    for k in 0..6 {
        // Each pass: the paused are out of the slot count, the rest are full.
        let live: Vec<_> = rs.iter().copied().filter(|r| !p.is_paused(r.id)).collect();
        let mut all = live.clone();
        // Refill up to 8 active with fresh non-eligible arrivals (as the admitted waiters).
        for j in 0..(8 - live.len() as u64) {
            all.push(res(100 + k * 10 + j, now, now, 1, 1, 100_000));
        }
        all.extend(rs.iter().copied().filter(|r| p.is_paused(r.id)));
        all.sort_by_key(|r| r.id);
        let d = step(&mut p, now, &all, &[], &risk_queue(now));
        assert!(d.pauses.len() <= 1);
        paused += d.pauses.len();
    }
    assert_eq!(paused, 3);
    assert_eq!(p.paused_count(), 3);
}

#[test]
fn resume_needs_64_iterations_before_the_next_pause_and_at_most_two_pauses() {
    let mut p = tpot();
    let mut rs = full_house();
    let mut now = 100.0;
    // Pause request 0.
    let d = step(&mut p, now, &rs, &[], &risk_queue(now));
    assert_eq!(d.pauses, vec![0]);
    // A slot frees (request 3 leaves): 0 resumes ahead of the waiter.
    now += 1.0;
    let dep = Departure {
        id: 3,
        completed: true,
        first_token_time: Some(3.5),
        finish_time: now,
        output_tokens: 1000,
    };
    let rs3: Vec<_> = rs[..3].to_vec();
    let d = step(&mut p, now, &rs3, &[dep], &risk_queue(now));
    assert_eq!(d.resumes, vec![0]);
    assert_eq!(d.admission_count, 3);
    // Full again right after: request 0 ran only 10 iterations since its resume.
    rs = rs3;
    rs.push(res(7, now, now, 1, 1, 100_000));
    rs[0].decode_iters += 10;
    for r in rs.iter_mut().skip(1) {
        r.decode_iters += 10;
    }
    now += 100.0;
    let d = step(&mut p, now, &rs, &[], &risk_queue(now));
    assert_eq!(d.pauses, vec![1], "0 is in its post-resume hysteresis");
    assert_eq!(p.pauses_of(0), 1);
}

/// Residents that react to decisions the way a worker would: each pause admits the
/// waiter as a fresh resident (first token just out, not yet eligible).
struct World {
    rs: Vec<Resident>,
    next: u64,
}

impl World {
    fn new(rs: Vec<Resident>) -> Self {
        Self { rs, next: 1000 }
    }
    fn step(
        &mut self,
        p: &mut GenPreemption,
        now: f64,
        q: &AdmissionQueue,
        departed: &[Departure],
    ) -> PreemptDecision {
        let d = step(p, now, &self.rs, departed, q);
        for _ in &d.pauses {
            self.rs.push(res(self.next, now, now, 1, 0, 100_000));
            self.next += 1;
        }
        d
    }
    /// Cancel a resident; returns its departure record.
    fn cancel(&mut self, id: u64, now: f64) -> Departure {
        self.rs.retain(|r| r.id != id);
        Departure {
            id,
            completed: false,
            first_token_time: Some(now),
            finish_time: now,
            output_tokens: 1,
        }
    }
    fn complete(&mut self, id: u64, ft: f64, now: f64) -> Departure {
        self.rs.retain(|r| r.id != id);
        Departure {
            id,
            completed: true,
            first_token_time: Some(ft),
            finish_time: now,
            output_tokens: 100,
        }
    }
    fn tick(&mut self, iters: u32) {
        for r in self.rs.iter_mut() {
            r.decode_iters += iters;
        }
    }
    fn last_admitted(&self) -> u64 {
        self.next - 1
    }
}

fn quiet(now: f64, d: Option<f64>) -> AdmissionQueue {
    queue_with_waiter(1.0, None, now, d)
}

/// Pauses request 0 of a full house `limit` times, each ended by a forced resume after the
/// maximum pause (0.35 D = 7 s), then finds the next pause taking request 1: request 0 has
/// used its pauses.
fn pauses_request_0_then_passes_it_over(p: &mut GenPreemption, limit: u32) {
    let mut w = World::new(full_house());
    let mut now = 100.0;
    for round in 0..=limit {
        let d = w.step(p, now, &risk_queue(now), &[]);
        if round == limit {
            assert_eq!(d.pauses, vec![1], "request 0 used its {limit} pauses");
            return;
        }
        assert_eq!(d.pauses, vec![0], "limit {limit}, round {round}");
        now += 7.5;
        let d = w.step(p, now, &quiet(now, None), &[]);
        assert_eq!(d.forced_resumes, vec![0]);
        let dep = w.cancel(w.last_admitted(), now);
        w.step(p, now, &quiet(now, None), &[dep]);
        w.tick(100);
    }
}

#[test]
fn budget_mode_caps_pauses_per_request_at_two() {
    pauses_request_0_then_passes_it_over(&mut tpot(), 2);
}

/// The simulator's `pauses=` ablation moves the limit; the rest of the rule stays.
#[test]
fn budget_mode_with_a_moved_limit_pauses_a_request_that_many_times() {
    for limit in [1, 3] {
        let params = PreemptParams {
            limits: PauseLimits { budget: limit },
            ..PreemptParams::new(Mode::TpotBudget(0.1), MAX)
        };
        pauses_request_0_then_passes_it_over(&mut with_d(GenPreemption::new(params), D), limit);
    }
}

#[test]
fn forced_resume_after_the_maximum_pause_even_with_no_free_slot() {
    let mut p = tpot();
    let mut w = World::new(full_house());
    let d = w.step(&mut p, 100.0, &risk_queue(100.0), &[]);
    assert_eq!(d.pauses, vec![0]);
    // The maximum pause is 0.35 D = 7 s.
    let d = w.step(&mut p, 106.9, &quiet(106.9, None), &[]);
    assert!(d.forced_resumes.is_empty() && d.resumes.is_empty());
    let d = w.step(&mut p, 107.0, &quiet(107.0, None), &[]);
    assert_eq!(d.forced_resumes, vec![0]);
    // Occupancy above max_active, which blocks admissions.
    assert_eq!(d.admission_count, MAX + 1);
}

#[test]
fn paused_requests_resume_oldest_pause_first_ahead_of_admissions() {
    let eight: Vec<_> = (0..8)
        .map(|i| res(i, i as f64, i as f64 + 0.5, 1000, 1000, 100_000))
        .collect();
    let run = |departing: &[u64]| {
        let mut p = tpot_with(8);
        let mut w = World::new(eight.clone());
        assert_eq!(
            w.step(&mut p, 100.0, &risk_queue(100.0), &[]).pauses,
            vec![0]
        );
        assert_eq!(
            w.step(&mut p, 100.5, &risk_queue(100.5), &[]).pauses,
            vec![1]
        );
        let deps: Vec<_> = departing
            .iter()
            .map(|&id| w.complete(id, 1.0, 101.0))
            .collect();
        w.step(&mut p, 101.0, &quiet(101.0, None), &deps)
    };
    // Two slots free up at once: both resume, oldest pause first; nothing left to admit.
    let d = run(&[6, 7]);
    assert_eq!(d.resumes, vec![0, 1]);
    assert_eq!(d.admission_count, 8);
    // One free slot: only the oldest pause resumes.
    let d = run(&[7]);
    assert_eq!(d.resumes, vec![0]);
}

#[test]
fn a_request_leaving_while_paused_leaves_the_paused_set() {
    let mut p = tpot();
    let rs = full_house();
    step(&mut p, 100.0, &rs, &[], &risk_queue(100.0));
    assert!(p.is_paused(0));
    let dep = Departure {
        id: 0,
        completed: false,
        first_token_time: Some(0.5),
        finish_time: 101.0,
        output_tokens: 1000,
    };
    let d = step(
        &mut p,
        101.0,
        &rs[1..],
        &[dep],
        &queue_with_waiter(1.0, None, 101.0, None),
    );
    assert!(!p.is_paused(0));
    assert_eq!(p.paused_count(), 0);
    assert!(d.resumes.is_empty() && d.forced_resumes.is_empty());
}

#[test]
fn running_means_exclude_pauses_and_start_from_the_first_completion() {
    assert_eq!(
        GenPreemption::new(PreemptParams::new(Mode::TpotBudget(0.1), MAX)).d(),
        None
    );
    let mut p = tpot();
    let rs = full_house();
    step(&mut p, 100.0, &rs, &[], &risk_queue(100.0)); // pause 0 at t=100
                                                       // Request 0 completes at 104 while paused since 100: 4 s of pause excluded.
    let dep = Departure {
        id: 0,
        completed: true,
        first_token_time: Some(0.5),
        finish_time: 104.0,
        output_tokens: 1000,
    };
    step(
        &mut p,
        104.0,
        &rs[1..],
        &[dep],
        &queue_with_waiter(1.0, None, 104.0, None),
    );
    let decode = 104.0 - 0.5 - 4.0;
    let d = p.d().unwrap();
    assert!((d - (D + decode) / 2.0).abs() < 1e-9, "D = {d}");
    let r0 = p.stats().r0().unwrap();
    assert!(
        (r0 - 999.0 / decode).abs() < 1e-9,
        "R0 from the one TPOT sample"
    );
}

#[test]
fn controller_steps_once_per_completion_only_after_x_forms() {
    let mut p = tpot();
    let no_x = AdmissionQueue::new(AdmissionParams {
        min_samples: 10,
        ..AdmissionParams::default()
    });
    let dep = |id| Departure {
        id,
        completed: true,
        first_token_time: Some(0.0),
        finish_time: 10.0,
        output_tokens: 100,
    };
    step(&mut p, 10.0, &[], &[dep(1), dep(2)], &no_x);
    assert_eq!(p.g(), Some(1.0), "no update before X");
    let with_x = queue_with_waiter(1.0, None, 10.0, None);
    step(&mut p, 10.0, &[], &[dep(3), dep(4)], &with_x);
    // Two unpaused completions: ln g grew by 2/3000.
    assert!((p.g().unwrap() - (2.0f64 / 3000.0).exp()).abs() < 1e-12);
}

#[test]
fn window_is_g_times_015_d_in_budget_mode_and_015_d_in_target_mode() {
    let mut p = tpot();
    let dep = Departure {
        id: 1,
        completed: true,
        first_token_time: Some(0.0),
        finish_time: 20.0,
        output_tokens: 100,
    };
    step(
        &mut p,
        20.0,
        &[],
        &[dep],
        &AdmissionQueue::new(AdmissionParams::default()),
    );
    assert!((p.window() - 3.0).abs() < 1e-12);
    let mut t = GenPreemption::new(PreemptParams::new(Mode::TargetOutputTps(10.0), MAX));
    step(
        &mut t,
        20.0,
        &[],
        &[dep],
        &AdmissionQueue::new(AdmissionParams::default()),
    );
    assert!((t.window() - 3.0).abs() < 1e-12);
}

#[test]
fn off_mode_never_pauses_and_resumes_everything_when_disabled() {
    let mut off = GenPreemption::new(PreemptParams::new(Mode::Off, MAX));
    let d = step(&mut off, 100.0, &full_house(), &[], &risk_queue(100.0));
    assert!(d.pauses.is_empty());
    let mut p = tpot();
    step(&mut p, 100.0, &full_house(), &[], &risk_queue(100.0));
    assert_eq!(p.paused_count(), 1);
    p.disable();
    let d = step(&mut p, 100.1, &full_house(), &[], &risk_queue(100.1));
    assert_eq!(d.forced_resumes, vec![0]);
    assert_eq!(p.paused_count(), 0);
}

/// The controller against its plain reference, over generated states and histories.
mod reference;
/// The `target_output_tps` mode: laxity tiers, forced resume by laxity, credit, lane.
mod target_mode;

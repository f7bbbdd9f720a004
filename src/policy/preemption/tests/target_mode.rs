//! `target_output_tps`: the victim tiers, the laxity-margin forced resume, the credit and
//! the resume lane.

use super::*;

/// A completion at 333 tok/s (above T) lasting 300 s: it sets D = 300 s and earns ε.
fn above_target_completion(id: u64) -> Departure {
    Departure {
        id,
        completed: true,
        first_token_time: Some(0.0),
        finish_time: 300.0,
        output_tokens: 100_000,
    }
}

fn target(t: f64) -> GenPreemption {
    GenPreemption::new(PreemptParams::new(Mode::TargetOutputTps(t), MAX))
}

/// Residents decoding at 100 tok/s since first token at 0 (no pauses), with different
/// max_tokens so their laxities against T = 50 differ.
fn rate_residents(now: f64, maxes: [u32; 4]) -> Vec<Resident> {
    (0..4u64)
        .map(|i| {
            let out = (now * 100.0) as u32 + 1;
            res(i, 0.1 * i as f64, 0.0, out, out, maxes[i as usize])
        })
        .collect()
}

#[test]
fn target_tier1_pauses_the_largest_slack_first() {
    let now = 10.0; // 1001 tokens out at 100 tok/s
    let mut p = target(50.0);
    // Laxity = (max−1)/50 − (10 + (max − 1001)/100): grows with max.
    let rs = rate_residents(now, [3000, 5000, 4000, 2000]);
    let d = step(&mut p, now, &rs, &[], &late_queue(now));
    assert_eq!(d.pauses, vec![1]);
}

#[test]
fn target_slack_pause_still_resumes_at_the_maximum_pause() {
    let mut p = target(50.0);
    let mut w = World::new(rate_residents(10.0, [3000, 5000, 4000, 2000]));
    assert_eq!(w.step(&mut p, 10.0, &late_queue(10.0), &[]).pauses, vec![1]);
    // Before any completion the maximum pause is 10 s; request 1 still has laxity.
    let d = w.step(&mut p, 19.0, &quiet(19.0, None), &[]);
    assert!(d.forced_resumes.is_empty());
    let d = w.step(&mut p, 20.0, &quiet(20.0, None), &[]);
    assert_eq!(d.forced_resumes, vec![1]);
}

#[test]
fn target_laxity_margin_forces_resume_before_the_maximum_pause() {
    let mut p = target(50.0);
    // A completion sets D = 50 s: max pause 17.5 s, minimum decode 3.5 s, laxity margin 0.5 s.
    let dep = Departure {
        id: 99,
        completed: true,
        first_token_time: Some(0.0),
        finish_time: 50.0,
        output_tokens: 10,
    };
    step(
        &mut p,
        0.0,
        &[],
        &[dep],
        &AdmissionQueue::new(AdmissionParams::default()),
    );
    // Request 0: 1601 max, 1001 out at t = 10 at 100 tok/s → laxity 32 − (t + 6) = 26 − t.
    // The others have 99 tokens left (< 3.5 s): near finished, not eligible.
    let mut w = World::new(rate_residents(10.0, [1601, 1100, 1100, 1100]));
    let d = w.step(
        &mut p,
        10.0,
        &queue_with_waiter(1.0, Some(0.0), 10.0, Some(50.0)),
        &[],
    );
    assert_eq!(d.pauses, vec![0]);
    let d = w.step(&mut p, 25.0, &quiet(25.0, Some(50.0)), &[]); // laxity 1.0 s
    assert!(d.forced_resumes.is_empty());
    let d = w.step(&mut p, 25.5, &quiet(25.5, Some(50.0)), &[]); // laxity 0.5 s = 0.01 D
    assert_eq!(d.forced_resumes, vec![0]);
}

#[test]
fn target_tier2_pauses_requests_already_below_target_up_to_three_times() {
    let mut p = target(500.0); // everyone decoding at 100 tok/s is below 500
    let mut w = World::new(rate_residents(10.0, [30_000; 4]));
    let mut now = 10.0;
    let mut victims = Vec::new();
    for _ in 0..5 {
        let d = w.step(&mut p, now, &late_queue(now), &[]);
        victims.extend(d.pauses.iter().copied());
        now += 10.0;
        w.step(&mut p, now, &quiet(now, None), &[]); // max pause forces it back
        let dep = w.cancel(w.last_admitted(), now);
        w.step(&mut p, now, &quiet(now, None), &[dep]);
        w.tick(100);
    }
    assert_eq!(victims, vec![0, 0, 0, 1, 1]);
}

#[test]
fn target_tier3_sacrifices_only_on_credit() {
    let mut p = target(95.0);
    // Completions at 333 tok/s (above T) with D = 300 s: each earns ε = 0.2.
    let dep = above_target_completion;
    let deps: Vec<_> = (100..104).map(dep).collect();
    step(&mut p, 0.0, &[], &deps, &quiet(0.0, None));
    // At t = 30, 3001 of 6000 tokens out at 100 tok/s: laxity ≈ 3.2 s, in [0, 0.02 D = 6 s).
    let rs = rate_residents(30.0, [6000; 4]);
    let d = step(&mut p, 30.0, &rs, &[], &late_queue(30.0));
    assert!(d.pauses.is_empty(), "credit 0.8 < 1: no sacrifice");
    step(&mut p, 30.0, &rs, &[dep(104)], &quiet(30.0, None));
    assert!(p.credit().unwrap() >= 1.0 - 1e-9);
    let d = step(&mut p, 30.0, &rs, &[], &late_queue(30.0));
    assert_eq!(d.pauses, vec![0], "sacrifice chosen as in tpot_budget");
    assert!(p.sacrificed(0));
    assert!(p.credit().unwrap().abs() < 1e-9);
}

#[test]
fn target_resume_lane_takes_least_slack_first() {
    let mut p = GenPreemption::new(PreemptParams::new(Mode::TargetOutputTps(50.0), 4));
    let mut w = World::new(rate_residents(10.0, [5000, 4000, 3000, 2500]));
    assert_eq!(w.step(&mut p, 10.0, &late_queue(10.0), &[]).pauses, vec![0]);
    assert_eq!(w.step(&mut p, 10.0, &late_queue(10.0), &[]).pauses, vec![1]);
    // One slot frees: the paused request with the least laxity (1) resumes first.
    let dep = w.cancel(w.last_admitted(), 11.0);
    let d = w.step(&mut p, 11.0, &quiet(11.0, None), &[dep]);
    assert_eq!(d.resumes, vec![1]);
}

#[test]
fn target_tier1_allows_eight_slack_pauses_per_request() {
    let mut p = target(50.0);
    // Request 0 has far more laxity than the rest, so it is the tier-1 victim until its
    // eight slack-bounded pauses are used up.
    let mut rs = rate_residents(10.0, [3000; 4]);
    rs[0].max_tokens = 100_000;
    let mut w = World::new(rs);
    let mut now = 10.0;
    let mut victims = Vec::new();
    for _ in 0..10 {
        victims.extend(w.step(&mut p, now, &late_queue(now), &[]).pauses);
        now += 10.0; // the maximum pause before any completion forces it back
        w.step(&mut p, now, &quiet(now, None), &[]);
        let dep = w.cancel(w.last_admitted(), now);
        w.step(&mut p, now, &quiet(now, None), &[dep]);
        w.tick(100);
    }
    // The ninth pause goes elsewhere: request 0's slack-bounded pauses are used up.
    assert_eq!(victims[..8], [0; 8], "{victims:?}");
    assert_ne!(victims[8], 0, "{victims:?}");
}

#[test]
fn target_resume_lane_puts_sacrificed_requests_last() {
    let mut p = target(95.0);
    // Five completions at 333 tok/s (above T) with D = 300 s: credit 1.0.
    let dep = above_target_completion;
    let deps: Vec<_> = (100..105).map(dep).collect();
    step(&mut p, 0.0, &[], &deps, &quiet(0.0, None));
    // At t = 30: requests 0–2 have laxity ≈ 3.2 s (< 0.02 D = 6 s); request 3 ≈ 31.6 s.
    let mut rs = rate_residents(30.0, [6000; 4]);
    rs[3].max_tokens = 60_000;
    let mut w = World::new(rs);
    assert_eq!(
        w.step(&mut p, 30.0, &late_queue(30.0), &[]).pauses,
        vec![3],
        "tier 1 first"
    );
    assert_eq!(
        w.step(&mut p, 30.0, &late_queue(30.0), &[]).pauses,
        vec![0],
        "then a sacrifice"
    );
    assert!(p.sacrificed(0));
    // One slot frees: request 0 has less laxity, but sacrificed requests resume last.
    let gone = w.cancel(w.last_admitted(), 31.0);
    let d = w.step(&mut p, 31.0, &quiet(31.0, None), &[gone]);
    assert_eq!(d.resumes, vec![3]);
}

// ---- target_output_tps: the bounded tier walk against a full scan ----

/// Every tier's choice by a full scan: each eligible unpaused resident's laxity computed and
/// compared, as the controller did before `tiers.rs` (the specification of the choice).
fn full_scan_target_victim(
    p: &GenPreemption,
    v: &StepView,
    t: f64,
) -> Option<(RequestId, PauseKind)> {
    let d = p.stats.d().unwrap_or(0.0);
    let el = p.eligibility(v.now);
    let key = p.params.victim_key;
    let better = |best: Option<&Resident>, r: &Resident| best.is_none_or(|b| key.cmp(r, b).is_lt());
    let mut slack: Option<(f64, RequestId)> = None;
    let mut below: Option<&Resident> = None;
    let mut sacrifice: Option<&Resident> = None;
    for r in v.residents {
        if p.paused.contains(r.id) {
            continue;
        }
        let rec = p.records.get(r.id).copied();
        let iters = r.decode_iters - rec.map_or(0, |x| x.iters_at_resume.min(r.decode_iters));
        let unpaused =
            GenPreemption::rate_state(r, rec.as_ref(), v.now).map_or(0.0, |s| s.unpaused_decode_s);
        if !el.eligible(r, iters, unpaused) {
            continue;
        }
        let fallback = p.stats.r0().unwrap_or(t);
        let lax = GenPreemption::rate_state(r, rec.as_ref(), v.now)
            .map_or(f64::INFINITY, |s| objective::laxity(&s, v.now, t, fallback));
        let rec = rec.unwrap_or_default();
        if !rec.sacrificed
            && u32::from(rec.slack_pauses) < SLACK_PAUSES_PER_REQUEST
            && lax >= SLACK_TIER_MIN_FRACTION_OF_D * d
            && slack.is_none_or(|b| victim::largest_slack_first((lax, r.id), b).is_lt())
        {
            slack = Some((lax, r.id));
        }
        if u32::from(rec.below_pauses) < BELOW_PAUSES_PER_REQUEST {
            if (lax < 0.0 || rec.sacrificed) && better(below, r) {
                below = Some(r);
            }
            if !rec.sacrificed && better(sacrifice, r) {
                sacrifice = Some(r);
            }
        }
    }
    if let Some((_, id)) = slack {
        return Some((id, PauseKind::Slack));
    }
    if let Some(r) = below {
        return Some((r.id, PauseKind::Below));
    }
    if !p.credit.can_sacrifice() {
        return None;
    }
    sacrifice.map(|r| (r.id, PauseKind::Sacrifice))
}

/// One random resident and its controller record. Values come from small sets, so equal
/// laxities (ties) are common. Half the residents are drawn from a narrow cluster (first
/// tokens within 1.5 s, a few tokens left), so laxities lie close to their deadline bounds
/// and to each other, where a wrong skip would show.
fn arb_resident() -> impl proptest::strategy::Strategy<Value = (Resident, Option<Record>, bool)> {
    use proptest::prelude::*;
    (
        (0u32..80, 0u32..6, 0u32..5, 0u32..10),
        (
            0u32..3,
            0u32..9,
            0u32..4,
            any::<bool>(),
            0u32..5,
            any::<bool>(),
        ),
        any::<bool>(),
    )
        .prop_map(
            |((ft, out, iters, rem), (rec, slack, below, sac, paused_s, is_paused), narrow)| {
                let (ft, rem) = if narrow {
                    (20 + ft % 4, rem % 6)
                } else {
                    (ft, rem)
                };
                let first_token_time = (ft > 0).then_some(0.5 * ft as f64);
                let output_tokens = [0, 1, 2, 50, 400, 900][out as usize];
                let r = Resident {
                    id: 0,
                    arrival: ft as f64,
                    admit_time: ft as f64 + 0.5,
                    first_token_time,
                    output_tokens,
                    decode_iters: [0, 63, 64, 500, 2000][iters as usize],
                    max_tokens: output_tokens
                        + [0, 1, 2, 3, 5, 10, 40, 600, 2000, 5000][rem as usize],
                };
                let record = (rec > 0).then(|| Record {
                    pauses: (slack + below) as u8,
                    slack_pauses: slack as u8,
                    below_pauses: below as u8,
                    sacrificed: sac,
                    paused_total: [0.0, 0.5, 1.0, 7.5, 30.0][paused_s as usize],
                    iters_at_resume: if rec == 2 { 10 } else { 0 },
                    paused: None,
                });
                (r, record, is_paused && record.is_some())
            },
        )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    #[test]
    fn bounded_tier_walk_picks_the_full_scans_victim(
        rows in proptest::collection::vec(arb_resident(), 0..40),
        t in proptest::sample::select(vec![5.0, 20.0, 40.0, 200.0]),
        d in proptest::option::of(proptest::sample::select(vec![0.5, 5.0, 60.0, 300.0])),
        credit_steps in 0u32..8,
        now in proptest::sample::select(vec![40.0, 55.0, 90.0]),
    ) {
        let mut p = target(t);
        if let Some(d) = d {
            p.stats.decode.push(d);
            p.stats.tpot.push(d / 1500.0);
        }
        for _ in 0..credit_steps {
            p.credit.complete(true, false);
        }
        let mut residents = Vec::new();
        for (i, (mut r, rec, is_paused)) in rows.into_iter().enumerate() {
            r.id = i as u64;
            if let Some(mut rec) = rec {
                if is_paused {
                    rec.paused = Some((now - 1.0, PauseKind::Slack));
                    p.paused.get_or_insert_with(r.id, || Paused::new(rec));
                }
                *p.records.get_or_insert_with(r.id, Record::default) = rec;
            }
            residents.push(r);
        }
        let q = AdmissionQueue::new(AdmissionParams::default());
        let v = StepView { now, residents: &residents, by_admission: None, departed: &[], queue: q.facts() };
        let expected = full_scan_target_victim(&p, &v, t);
        proptest::prop_assert_eq!(p.target_victim(&v, t), expected);
    }
}

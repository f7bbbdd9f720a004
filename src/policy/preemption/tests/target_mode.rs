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

use super::*;
use proptest::prelude::*;

fn params(min_samples: usize) -> AdmissionParams {
    AdmissionParams {
        min_samples,
        target_window: 100,
        ..AdmissionParams::default()
    }
}

fn w(id: u64, arrival: f64) -> Waiter {
    Waiter {
        id,
        arrival,
        context_tokens: 1000,
        max_tokens: 100,
    }
}

#[test]
fn a_fixed_target_replaces_the_percentile_once_formed() {
    let mut q = AdmissionQueue::new(AdmissionParams {
        fixed_target: Some(13.5),
        ..params(3)
    });
    q.observe_ttft(1.0);
    q.observe_ttft(1.0);
    assert_eq!(q.target(), None, "not formed before min_samples");
    q.observe_ttft(1.0);
    assert_eq!(q.target(), Some(13.5));
    let fcfs = AdmissionQueue::new(AdmissionParams {
        policy: AdmissionPolicy::Fcfs,
        fixed_target: Some(13.5),
        ..params(0)
    });
    assert_eq!(fcfs.target(), None, "fcfs never forms X");
}

/// A queue whose X is formed at `x` seconds (all samples equal), no transfer or step time.
fn formed(x: f64) -> AdmissionQueue {
    let mut q = AdmissionQueue::new(params(10));
    for _ in 0..10 {
        q.observe_ttft(x);
    }
    q
}

#[test]
fn no_target_means_fifo_and_nothing_at_risk() {
    let mut q = AdmissionQueue::new(params(10));
    q.push(w(1, 5.0)).unwrap();
    q.push(w(2, 0.0)).unwrap();
    q.refresh(1000.0, Some(10.0));
    assert!(!q.target_formed());
    assert_eq!(
        q.facts().head_slack,
        None,
        "no slack, so no head is ever at risk"
    );
    assert_eq!(q.at_risk_count(f64::INFINITY), 0);
    assert_eq!(q.head().map(|h| h.tier), Some(Tier::NoTarget));
    // FIFO is arrival order.
    assert_eq!(q.pop().map(|p| p.waiter.id), Some(2));
}

#[test]
fn target_forms_at_min_samples() {
    let mut q = AdmissionQueue::new(params(3));
    q.observe_ttft(1.0);
    q.observe_ttft(2.0);
    assert_eq!(q.target(), None);
    q.observe_ttft(3.0);
    assert_eq!(q.target(), Some(3.0)); // p90 of {1,2,3} by nearest rank
}

#[test]
fn fcfs_never_forms_a_target() {
    let mut q = AdmissionQueue::new(AdmissionParams {
        policy: AdmissionPolicy::Fcfs,
        ..params(1)
    });
    for _ in 0..50 {
        q.observe_ttft(1.0);
    }
    assert_eq!(q.target(), None);
}

#[test]
fn slack_is_x_minus_age_plus_s2f() {
    let mut q = formed(10.0);
    for _ in 0..100 {
        q.observe_step(0.5);
        q.observe_transfer(1000, 1.0);
    }
    q.push(w(1, 100.0)).unwrap();
    q.refresh(103.0, Some(0.0));
    // 100 transfer observations re-key the queue at this refresh: s2f = 1.0 + 0.5.
    let h = q.head().unwrap();
    assert!(
        (h.slack.unwrap() - (10.0 - 3.0 - 0.5 - 1.0)).abs() < 1e-9,
        "{h:?}"
    );
}

#[test]
fn head_tier_follows_its_slack_guard_then_late_then_overdue() {
    let mut q = formed(10.0);
    q.push(w(1, 0.0)).unwrap();
    // D = 20 s → W₀ = 3 s. At now = 8 the slack is 2: guard.
    q.refresh(8.0, Some(20.0));
    assert_eq!(q.head().unwrap().tier, Tier::Guard);
    assert_eq!(q.facts().head_slack, Some(2.0));
    // now = 11: slack −1, late but short of overdue.
    q.refresh(11.0, Some(20.0));
    assert_eq!(q.head().unwrap().tier, Tier::Late);
    // now = 13: slack −3 = −W₀, overdue.
    q.refresh(13.0, Some(20.0));
    assert_eq!(q.head().unwrap().tier, Tier::Overdue);
    assert_eq!(q.facts().head_slack, Some(-3.0));
}

#[test]
fn on_time_head_is_reported_even_when_a_later_waiter_is_closer_to_x() {
    let mut q = AdmissionQueue::new(AdmissionParams {
        policy: AdmissionPolicy::Fcfs,
        ..params(1)
    });
    q.push(w(1, 0.0)).unwrap();
    q.refresh(1.0, Some(0.0));
    assert_eq!(q.facts().head_slack, None, "fcfs: no target");
    // The auto queue: the head on time (slack 9 ≥ W₀ = 3) is what the controller sees.
    let mut q = formed(10.0);
    q.push(w(1, 0.0)).unwrap();
    q.push(w(2, 0.5)).unwrap();
    q.refresh(1.0, Some(20.0));
    assert_eq!(q.head().unwrap().tier, Tier::OnTime);
    assert_eq!(q.facts().head_slack, Some(9.0));
    // The count still sees every waiter under a window.
    assert_eq!(q.at_risk_count(9.5), 1);
    assert_eq!(q.at_risk_count(9.6), 2);
}

/// Six waiters at now = 20 with X = 10 and D = 40 (W₀ = 6); slack = 10 − (20 − arrival).
fn six_tiers(policy: AdmissionPolicy) -> AdmissionQueue {
    let mut q = formed(10.0);
    q.params.policy = policy;
    q.push(w(1, 1.0)).unwrap(); // slack −9: overdue
    q.push(w(2, 3.0)).unwrap(); // slack −7: overdue, less late
    q.push(w(3, 5.0)).unwrap(); // slack −5: late
    q.push(w(4, 8.0)).unwrap(); // slack −2: late
    q.push(w(5, 14.0)).unwrap(); // slack 4: guard
    q.push(w(6, 12.0)).unwrap(); // slack 2: guard, least slack
    q.push(w(7, 19.0)).unwrap(); // slack 9: on time
    q.push(w(8, 18.0)).unwrap(); // slack 8: on time, older
    q.refresh(20.0, Some(40.0));
    q
}

fn pop_all(q: &mut AdmissionQueue) -> Vec<u64> {
    std::iter::from_fn(|| q.pop().map(|p| p.waiter.id)).collect()
}

#[test]
fn auto_pops_overdue_by_least_slack_then_guard_then_late_oldest_then_on_time_oldest() {
    let mut q = six_tiers(AdmissionPolicy::Auto);
    let counts = q.tier_counts();
    assert_eq!(
        (counts.overdue, counts.late, counts.guard, counts.on_time),
        (2, 2, 2, 2)
    );
    assert_eq!(pop_all(&mut q), vec![1, 2, 6, 5, 3, 4, 8, 7]);
}

#[test]
fn an_overdue_waiter_is_popped_ahead_of_a_guard_waiter() {
    let mut q = formed(10.0);
    q.push(w(1, 12.0)).unwrap(); // slack 2: guard
    q.push(w(2, 3.5)).unwrap(); // slack −6.5 ≤ −W₀: overdue
    q.refresh(20.0, Some(40.0));
    assert_eq!(q.head().unwrap().id, 2);
    assert_eq!(q.head().unwrap().tier, Tier::Overdue);
}

#[test]
fn a_late_waiter_short_of_overdue_waits_behind_a_guard_waiter() {
    let mut q = formed(10.0);
    q.push(w(1, 5.0)).unwrap(); // slack −5 > −W₀: late, not overdue
    q.push(w(2, 12.0)).unwrap(); // slack 2: guard
    q.refresh(20.0, Some(40.0));
    assert_eq!(q.head().unwrap().id, 2);
    assert_eq!(pop_all(&mut q), vec![2, 1]);
}

#[test]
fn guard_first_is_the_v1_order_without_the_overdue_tier() {
    let mut q = six_tiers(AdmissionPolicy::GuardFirst);
    assert_eq!(pop_all(&mut q), vec![6, 5, 1, 2, 3, 4, 8, 7]);
}

#[test]
fn queue_is_bounded_and_nothing_queued_is_lost() {
    let mut q = AdmissionQueue::new(AdmissionParams {
        max_waiting: 2,
        ..params(1)
    });
    q.push(w(1, 0.0)).unwrap();
    q.push(w(2, 0.0)).unwrap();
    assert_eq!(q.push(w(3, 0.0)), Err(QueueError::Full { max_waiting: 2 }));
    assert_eq!(q.len(), 2);
    assert!(q.contains(1) && q.contains(2) && !q.contains(3));
    assert_eq!(q.push(w(1, 0.0)), Err(QueueError::Duplicate(1)));
}

#[test]
fn waited_flag_marks_requests_left_behind_by_an_admission_phase() {
    let mut q = AdmissionQueue::new(params(1));
    q.push(w(1, 0.0)).unwrap();
    q.push(w(2, 0.0)).unwrap();
    q.refresh(0.0, None);
    assert!(!q.pop().unwrap().waited);
    q.mark_left_behind();
    q.push(w(3, 1.0)).unwrap();
    assert!(q.pop().unwrap().waited);
    assert!(!q.pop().unwrap().waited);
}

#[derive(Debug, Clone)]
enum Op {
    Push { arrival: f64, ctx: u32 },
    Pop,
    Cancel(usize),
    Refresh { dt: f64, d: f64 },
    Ttft(f64),
    Transfer(u32, f64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0.0..50.0f64, 0u32..200_000).prop_map(|(arrival, ctx)| Op::Push { arrival, ctx }),
        2 => Just(Op::Pop),
        1 => (0usize..64).prop_map(Op::Cancel),
        3 => (-2.0..5.0f64, 0.0..60.0f64).prop_map(|(dt, d)| Op::Refresh { dt, d }),
        2 => (0.0..30.0f64).prop_map(Op::Ttft),
        2 => (0u32..200_000, 0.0..3.0f64).prop_map(|(c, s)| Op::Transfer(c, s)),
    ]
}

proptest! {
    /// The indexed queue pops exactly what a brute-force scan of slack would pop.
    #[test]
    fn indexed_pop_order_matches_brute_force(
        ops in prop::collection::vec(op(), 1..300),
        policy in prop::sample::select(crate::policy::names::all::<AdmissionPolicy>()),
    ) {
        let mut q = AdmissionQueue::new(AdmissionParams { policy, min_samples: 5, target_window: 20, ..AdmissionParams::default() });
        let mut now = 0.0f64;
        let mut next_id = 0u64;
        let mut ids: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Push { arrival, ctx } => {
                    let wt = Waiter { id: next_id, arrival: now - arrival, context_tokens: ctx, max_tokens: 10 };
                    q.push(wt).unwrap();
                    ids.push(next_id);
                    next_id += 1;
                }
                Op::Cancel(i) => {
                    if !ids.is_empty() {
                        let id = ids.remove(i % ids.len());
                        prop_assert!(q.cancel(id));
                    }
                }
                Op::Refresh { dt, d } => {
                    now += dt;
                    q.refresh(now, Some(d));
                    prop_assert_eq!(q.tier_counts(), brute_tier_counts(&q));
                }
                Op::Ttft(t) => q.observe_ttft(t),
                Op::Transfer(c, s) => q.observe_transfer(c, s),
                Op::Pop => {
                    // Brute force over the keys the queue uses (its frozen transfer line).
                    let expect = brute_head(&q);
                    let got = q.pop().map(|p| p.waiter.id);
                    prop_assert_eq!(got, expect);
                    if let Some(id) = got { ids.retain(|&x| x != id); }
                }
            }
        }
    }
}

/// The head by scanning every waiter: each tier's candidate found without the index, then the
/// policy's own order (`next`) over them. The index is checked for every policy, a new one
/// included, without a second copy of the orders here (`order.rs` tests the orders).
fn brute_head(q: &AdmissionQueue) -> Option<u64> {
    let seq = next(q.params.policy, q.common.is_some(), &ScannedOffers(q))?;
    q.entries.get(&seq).map(|e| e.waiter.id)
}

/// The tiers' candidates by scanning every waiter, on keys as the index defines the tiers.
struct ScannedOffers<'a>(&'a AdmissionQueue);

impl ScannedOffers<'_> {
    /// The first waiter by `(value, seq)` among those `keep` accepts.
    fn first_by(&self, value: impl Fn(&Entry) -> f64, keep: impl Fn(f64) -> bool) -> Option<u64> {
        self.0
            .entries
            .iter()
            .filter(|(_, e)| keep(e.key))
            .min_by(|a, b| value(a.1).total_cmp(&value(b.1)).then(a.0.cmp(b.0)))
            .map(|(seq, _)| *seq)
    }
    /// `C`, and the guard window: a tier needs both; none exists without a target.
    fn tiers(&self) -> Option<(f64, f64)> {
        self.0.common.map(|c| (c, self.0.guard_window))
    }
}

fn arrival(e: &Entry) -> f64 {
    e.waiter.arrival
}

fn key(e: &Entry) -> f64 {
    e.key
}

impl Offers for ScannedOffers<'_> {
    fn oldest(&self) -> Option<u64> {
        self.first_by(arrival, |_| true)
    }
    fn least_slack(&self) -> Option<u64> {
        self.first_by(key, |_| true)
    }
    fn overdue(&self) -> Option<u64> {
        let (c, w0) = self.tiers()?;
        self.first_by(key, |k| k < -c && k <= -w0 - c)
    }
    fn guard(&self) -> Option<u64> {
        let (c, w0) = self.tiers()?;
        self.first_by(key, |k| k >= -c && k < w0 - c)
    }
    fn late(&self) -> Option<u64> {
        let (c, _) = self.tiers()?;
        self.first_by(arrival, |k| k < -c)
    }
    fn on_time(&self) -> Option<u64> {
        let (c, w0) = self.tiers()?;
        self.first_by(arrival, |k| k >= w0 - c)
    }
}

/// Tier counts by scanning every waiter, on keys as the index defines the tiers.
fn brute_tier_counts(q: &AdmissionQueue) -> TierCounts {
    let mut n = TierCounts::default();
    let Some(c) = q.common else {
        return n;
    };
    for e in q.entries.values() {
        let k = e.key;
        if k < -c && k <= -q.guard_window - c {
            n.overdue += 1;
        } else if k < -c {
            n.late += 1;
        } else if k < q.guard_window - c {
            n.guard += 1;
        } else {
            n.on_time += 1;
        }
    }
    n
}

/// Room of `pages` free 32-token pages: a head fits when its context's pages are free, and
/// takes them.
fn page_room(pages: &mut u64) -> impl FnMut(&Waiter) -> bool + '_ {
    move |w| {
        let need = u64::from(w.context_tokens.max(1).div_ceil(32));
        let fits = need <= *pages;
        if fits {
            *pages -= need;
        }
        fits
    }
}

#[test]
fn pop_admissible_stops_at_the_first_head_that_does_not_fit() {
    let mut q = AdmissionQueue::new(params(10));
    let big = Waiter {
        context_tokens: 32 * 40,
        ..w(2, 1.0)
    };
    for x in [w(1, 0.0), big, w(3, 2.0)] {
        q.push(x).unwrap();
    }
    q.refresh(10.0, None);
    let mut pages = 50;
    let mut popped = Vec::new();
    q.pop_admissible(8, page_room(&mut pages), &mut popped);
    // 1 takes 32 pages, 2 needs 40 of the 18 left: 3 (which would fit) waits behind it.
    assert_eq!(popped.iter().map(|p| p.waiter.id).collect::<Vec<_>>(), [1]);
    assert_eq!(pages, 18);
    assert_eq!(q.len(), 2);
    // Those left behind waited for room; the next admission says so.
    let mut popped = Vec::new();
    q.pop_admissible(8, page_room(&mut 1000), &mut popped);
    assert!(popped.iter().all(|p| p.waited));
    assert_eq!(popped.len(), 2);
}

#[test]
fn pop_admissible_takes_at_most_max() {
    let mut q = AdmissionQueue::new(params(10));
    for i in 0..5 {
        q.push(w(i, i as f64)).unwrap();
    }
    q.refresh(10.0, None);
    let mut popped = Vec::new();
    q.pop_admissible(2, page_room(&mut 1000), &mut popped);
    assert_eq!(
        popped.iter().map(|p| p.waiter.id).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(q.len(), 3);
}

#[test]
fn facts_carry_the_head_slack_only_once_x_is_formed() {
    let mut q = AdmissionQueue::new(params(10));
    q.push(w(1, 0.0)).unwrap();
    q.refresh(5.0, None);
    assert_eq!(q.facts(), QueueFacts::default());
    let mut q = formed(1.0);
    q.push(w(1, 0.0)).unwrap();
    q.refresh(5.0, None);
    let f = q.facts();
    assert!(f.target_formed);
    // X = 1 s, waited 5 s, no transfer or step time: slack −4 s.
    assert_eq!(f.head_slack, Some(-4.0));
}

//! AgentX closed-loop replay and open-loop replay, driven the way the simulator drives
//! them: the test plays the server and decides when each issue completes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use genslot::workload::{
    load_weka, AgentxReplay, HashIds, Issue, OpenLoopReplay, OpenLoopRules, Replay, ReplayError,
    ReplayRules, Request, Session, Subagent, TimedRequest,
};

fn req(t: f64, input: u32, api: f64) -> Request {
    Request {
        t,
        input_tokens: input,
        output_tokens: input / 10,
        api_time: Some(api),
        think_time: None,
        hash_ids: HashIds::from_runs([genslot::workload::HashRun {
            start: 1,
            len: input.div_ceil(64),
        }]),
        streaming: false,
    }
}

/// A root chain with requests at the given `(t, api_time)`; inputs are 1000, 1001, …
fn chain(id: &str, times: &[(f64, f64)]) -> Session {
    Session {
        id: id.into(),
        block_size: 64,
        requests: times
            .iter()
            .enumerate()
            .map(|(i, &(t, api))| req(t, 1000 + i as u32, api))
            .collect(),
        subagents: Vec::new(),
    }
}

fn rules(concurrency: usize, start: f64, cap: f64, warmup: bool) -> ReplayRules {
    ReplayRules {
        concurrency,
        start_fraction: (start, start),
        idle_cap_s: cap,
        warmup,
    }
}

fn engine(sessions: Vec<Session>, r: ReplayRules, seed: u64) -> AgentxReplay {
    AgentxReplay::new(Arc::from(sessions), r, seed).unwrap()
}

/// Pops exactly one due issue at `now`.
fn one(e: &mut AgentxReplay, now: f64) -> Issue {
    let mut due = e.pop_due(now);
    assert_eq!(due.len(), 1, "expected one issue at {now}, got {due:?}");
    due.remove(0)
}

#[test]
fn the_turn_before_the_random_start_is_sent_first_as_a_flagged_warmup() {
    let times: Vec<(f64, f64)> = (0..10).map(|i| (10.0 * i as f64, 1.0)).collect();
    let mut e = engine(vec![chain("s", &times)], rules(1, 0.45, 100.0, true), 1);
    e.start(0.0);
    let w = one(&mut e, 0.0);
    assert!(w.warmup);
    assert_eq!(
        w.input_tokens, 1004,
        "t* = 40.5 → first measured turn is t=50, warm-up t=40"
    );
    e.on_complete(w.id, 3.0).unwrap();
    assert_eq!(e.next_due(), Some(3.0 + 9.0), "gap 50 - (40 + 1)");
    let first = one(&mut e, 12.0);
    assert!(!first.warmup);
    assert_eq!(first.input_tokens, 1005);
}

#[test]
fn without_warmup_the_lane_starts_at_the_first_turn_after_the_start_point() {
    let times: Vec<(f64, f64)> = (0..10).map(|i| (10.0 * i as f64, 1.0)).collect();
    let mut e = engine(vec![chain("s", &times)], rules(1, 0.45, 100.0, false), 1);
    e.start(5.0);
    let first = one(&mut e, 5.0);
    assert!(!first.warmup);
    assert_eq!(first.input_tokens, 1005);
    assert_eq!(first.send_at, 5.0);
}

#[test]
fn gaps_are_measured_end_to_start_clamped_at_zero_and_capped() {
    // Gaps end-to-start: 10-(0+2)=8, 12-(10+5)=-3→0, 100-(12+1)=87→cap 10.
    let s = chain("s", &[(0.0, 2.0), (10.0, 5.0), (12.0, 1.0), (100.0, 1.0)]);
    let mut e = engine(vec![s], rules(1, 0.0, 10.0, true), 3);
    e.start(0.0);
    let a = one(&mut e, 0.0);
    assert!(
        !a.warmup,
        "starting at turn 0 leaves no turn to warm up with"
    );
    e.on_complete(a.id, 1.5).unwrap();
    assert_eq!(e.next_due(), Some(9.5));
    assert!(
        e.pop_due(9.4).is_empty(),
        "nothing is sent before its gap elapses"
    );
    let b = one(&mut e, 9.5);
    e.on_complete(b.id, 20.0).unwrap();
    let c = one(&mut e, 20.0);
    assert_eq!(c.send_at, 20.0);
    e.on_complete(c.id, 21.0).unwrap();
    assert_eq!(e.next_due(), Some(31.0));
}

#[test]
fn max_tokens_is_the_recorded_output_and_at_least_one() {
    let sessions = load_weka(&fixture("weka_single.json")).unwrap();
    let mut e = engine(sessions, rules(1, 0.0, 1000.0, true), 0);
    let issues = run(&mut e, 0.0, 50, |_| 1.0);
    let outs: Vec<u32> = issues.iter().take(6).map(|i| i.max_tokens).collect();
    assert_eq!(
        outs,
        vec![100, 50, 20, 30, 80, 1],
        "the recorded out=0 is sent as 1"
    );
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/workload")
        .join(name)
}

/// Drives `e` like a server: every issue completes `service(issue)` seconds after it is
/// sent. Returns the issues in send order, stopping after `limit`.
fn run(e: &mut AgentxReplay, t0: f64, limit: usize, service: impl Fn(&Issue) -> f64) -> Vec<Issue> {
    let mut now = t0;
    e.start(now);
    let mut out = Vec::new();
    let mut completions: BTreeMap<(u64, u64), u64> = BTreeMap::new(); // (time bits, id) -> id
    while out.len() < limit {
        let next_send = e.next_due();
        let next_done = completions.keys().next().map(|k| f64::from_bits(k.0));
        now = match (next_send, next_done) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        while let Some((&k, &id)) = completions.iter().next() {
            if f64::from_bits(k.0) > now {
                break;
            }
            completions.remove(&k);
            e.on_complete(id, now).unwrap();
        }
        for issue in e.pop_due(now) {
            let done = now + service(&issue);
            completions.insert((done.to_bits(), issue.id), issue.id);
            out.push(issue);
        }
    }
    out
}

#[test]
fn subagents_run_in_the_parent_lane_and_the_parent_waits_for_their_result() {
    let sessions = load_weka(&fixture("weka_single.json")).unwrap();
    let mut e = engine(sessions, rules(1, 0.0, 100.0, true), 0);
    e.start(0.0);
    let r0 = one(&mut e, 0.0);
    e.on_complete(r0.id, 1.0).unwrap();
    let r1 = one(&mut e, 9.0); // gap 10 - (0 + 2)
    e.on_complete(r1.id, 10.0).unwrap();
    // Sub-agent spawned at 20, 7 s after the parent's recorded end (13); the parent's next
    // turn (t=45) is recorded after the sub-agent ended (40), so it waits for it.
    assert_eq!(e.next_due(), Some(17.0));
    let s0 = one(&mut e, 17.0);
    assert_eq!((s0.lane, s0.depth, s0.input_tokens), (Some(0), 1, 500));
    e.on_complete(s0.id, 18.0).unwrap();
    let s1 = one(&mut e, 24.0); // 30 - (20 + 4)
    assert!(
        e.pop_due(1000.0).is_empty(),
        "the parent waits for the sub-agent"
    );
    e.on_complete(s1.id, 30.0).unwrap();
    let r3 = one(&mut e, 40.0); // 45 - (30 + 5) after the sub-agent's last request
    assert_eq!((r3.depth, r3.input_tokens), (0, 2000));
    assert_eq!(
        s0.hash_ids.to_vec().first(),
        Some(&s1.hash_ids.to_vec()[0]),
        "sub-agent turns share a prefix"
    );
}

fn fan_out_session() -> Session {
    let mut root = chain("fan", &[(0.0, 1.0), (100.0, 1.0)]);
    for k in 0..3 {
        let mut sub = chain(&format!("fan/agent_{k}"), &[(2.0, 5.0), (9.0, 5.0)]);
        sub.requests
            .iter_mut()
            .for_each(|r| r.input_tokens = 100 + k);
        root.subagents.push(Subagent {
            after_request: 1,
            marker_t: 14.0,
            spawn_t: 2.0,
            end_t: 14.0,
            agent_id: format!("agent_{k}"),
            subagent_type: "Explore".into(),
            session: sub,
        });
    }
    root
}

#[test]
fn parallel_subagents_exceed_the_lane_count_without_taking_lanes() {
    let mut e = engine(vec![fan_out_session()], rules(1, 0.0, 10.0, true), 0);
    e.start(0.0);
    let r0 = one(&mut e, 0.0);
    e.on_complete(r0.id, 1.0).unwrap();
    let fan = e.pop_due(2.0);
    assert_eq!(fan.len(), 3, "three sub-agents start together");
    assert!(fan.iter().all(|i| i.lane == Some(0) && i.depth == 1));
    assert_eq!(
        e.in_flight(),
        3,
        "in flight exceeds concurrency 1 during fan-out"
    );
    assert_eq!(e.lane_sessions().len(), 1);
}

#[test]
fn lanes_never_hold_more_than_c_root_sessions() {
    let sessions: Vec<Session> = (0..7)
        .map(|i| {
            if i % 2 == 0 {
                fan_out_session()
            } else {
                chain(&format!("c{i}"), &[(0.0, 1.0), (5.0, 1.0), (9.0, 2.0)])
            }
        })
        .collect();
    let c = 3;
    let mut e = engine(sessions, rules(c, 0.0, 10.0, true), 11);
    let issues = run(&mut e, 0.0, 400, |i| 0.5 + f64::from(i.input_tokens % 7));
    assert_eq!(issues.len(), 400);
    // Each lane replays one tree at a time: its instances appear in contiguous blocks.
    let mut per_lane: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for i in &issues {
        let lane = i.lane.unwrap();
        assert!(lane < c);
        let v = per_lane.entry(lane).or_default();
        if v.last() != Some(&i.instance) {
            assert!(
                !v.contains(&i.instance),
                "lane {lane} went back to an old tree"
            );
            v.push(i.instance);
        }
    }
    assert_eq!(per_lane.len(), c);
    let instances: BTreeSet<u64> = issues.iter().map(|i| i.instance).collect();
    let total: usize = per_lane.values().map(Vec::len).sum();
    assert_eq!(total, instances.len(), "no tree is shared by two lanes");
}

#[test]
fn a_drained_lane_draws_the_next_session_at_once_from_turn_zero() {
    let sessions = vec![
        chain("a", &[(0.0, 1.0), (50.0, 1.0)]),
        chain("b", &[(0.0, 1.0), (50.0, 1.0)]),
    ];
    let mut e = engine(sessions, rules(1, 1.0, 10.0, false), 5);
    e.start(0.0);
    let last = one(&mut e, 0.0);
    assert_eq!(
        last.input_tokens, 1001,
        "start fraction 1 begins at the last turn"
    );
    e.on_complete(last.id, 7.0).unwrap();
    let next = one(&mut e, 7.0);
    assert_eq!(next.send_at, 7.0);
    assert_ne!(next.instance, last.instance);
    assert_eq!(
        next.input_tokens, 1000,
        "a later session starts from turn 0"
    );
    assert!(
        !next.warmup,
        "only a lane's first session has a warm-up turn"
    );
}

#[test]
fn every_session_is_drawn_once_before_any_repeats() {
    let sessions: Vec<Session> = (0..5)
        .map(|i| chain(&format!("s{i}"), &[(0.0, 1.0)]))
        .collect();
    let mut e = engine(sessions, rules(1, 0.0, 10.0, true), 9);
    let issues = run(&mut e, 0.0, 10, |_| 1.0);
    let first: BTreeSet<usize> = issues[..5].iter().map(|i| i.session).collect();
    let second: BTreeSet<usize> = issues[5..].iter().map(|i| i.session).collect();
    assert_eq!(first.len(), 5);
    assert_eq!(second.len(), 5);
}

#[test]
fn same_seed_and_completions_give_identical_issues_and_seeds_differ() {
    let sessions: Vec<Session> = (0..12)
        .map(|i| {
            let times: Vec<(f64, f64)> = (0..(3 + i % 4))
                .map(|k| (f64::from(k) * (3.0 + f64::from(i)), 1.0))
                .collect();
            let mut s = chain(&format!("s{i}"), &times);
            if i % 3 == 0 {
                s.subagents = fan_out_session().subagents;
            }
            s
        })
        .collect();
    let service = |i: &Issue| 0.25 + f64::from(i.input_tokens % 5);
    let go = |seed| {
        let mut e = engine(sessions.clone(), rules(4, 0.0, 10.0, true), seed);
        let mut e2 = engine(sessions.clone(), rules(4, 0.0, 10.0, true), seed);
        let (a, b) = (
            run(&mut e, 0.0, 300, service),
            run(&mut e2, 0.0, 300, service),
        );
        assert_eq!(a, b);
        a
    };
    let a = go(42);
    let b = go(43);
    let order = |v: &[Issue]| v.iter().map(|i| i.session).collect::<Vec<_>>();
    assert_ne!(order(&a), order(&b), "the seed changes the session draw");
}

#[test]
fn concurrent_replays_of_one_session_do_not_share_prefix_hashes() {
    let s = chain("only", &[(0.0, 1.0), (5.0, 1.0)]);
    let mut e = engine(vec![s], rules(2, 0.0, 10.0, true), 1);
    e.start(0.0);
    let both = e.pop_due(0.0);
    assert_eq!(both.len(), 2);
    assert_eq!(both[0].hash_ids.len(), 16);
    assert_ne!(both[0].hash_ids, both[1].hash_ids);
    let (a, b) = (both[0].clone(), both[1].clone());
    e.on_complete(a.id, 1.0).unwrap();
    let a2 = one(&mut e, 5.0);
    assert_eq!(a2.instance, a.instance);
    assert_eq!(
        a2.hash_ids.to_vec()[..16],
        a.hash_ids.to_vec()[..],
        "turns of one replay share their prefix"
    );
    assert_eq!(a2.hash_ids.common_prefix_len(&a.hash_ids), 16);
    assert_ne!(b.instance, a.instance);
}

#[test]
fn completing_an_unknown_or_unsent_issue_is_an_error() {
    let s = chain("s", &[(0.0, 1.0), (5.0, 1.0)]);
    let mut e = engine(vec![s], rules(1, 0.0, 10.0, true), 1);
    e.start(0.0);
    assert_eq!(
        e.on_complete(0, 0.0),
        Err(ReplayError::UnknownIssue(0)),
        "not popped yet"
    );
    let a = one(&mut e, 0.0);
    e.on_complete(a.id, 1.0).unwrap();
    assert_eq!(
        e.on_complete(a.id, 1.0),
        Err(ReplayError::UnknownIssue(a.id))
    );
    assert_eq!(e.on_complete(99, 1.0), Err(ReplayError::UnknownIssue(99)));
}

#[test]
fn bad_rules_and_empty_corpora_are_refused() {
    let s = || vec![chain("s", &[(0.0, 1.0)])];
    let bad = |r: ReplayRules| AgentxReplay::new(Arc::from(s()), r, 0).is_err();
    assert!(bad(rules(0, 0.0, 10.0, true)));
    assert!(bad(ReplayRules {
        start_fraction: (0.8, 0.2),
        ..ReplayRules::default()
    }));
    assert!(bad(rules(1, 0.0, -1.0, true)));
    let empty = vec![chain("e", &[])];
    assert_eq!(
        AgentxReplay::new(Arc::from(empty), ReplayRules::default(), 0).err(),
        Some(ReplayError::NoSessions)
    );
}

#[test]
fn stopping_new_sessions_lets_the_run_finish() {
    let mut e = engine(
        vec![chain("s", &[(0.0, 1.0), (2.0, 1.0)])],
        rules(1, 0.0, 10.0, true),
        1,
    );
    e.start(0.0);
    e.stop_new_sessions();
    let a = one(&mut e, 0.0);
    e.on_complete(a.id, 1.0).unwrap();
    assert!(!e.is_finished());
    let b = one(&mut e, 2.0); // gap 2 - (0 + 1)
    e.on_complete(b.id, 2.0).unwrap();
    assert!(e.is_finished());
    assert_eq!(e.next_due(), None);
}

fn timed(ts: &[f64]) -> Arc<[TimedRequest]> {
    ts.iter()
        .enumerate()
        .map(|(i, &t)| TimedRequest {
            t,
            input_tokens: 100 + i as u32,
            output_tokens: 0,
            hash_ids: HashIds::from_ids(&[i as u64]),
            block_size: 512,
        })
        .collect()
}

#[test]
fn open_loop_sends_by_timestamp_scaled_from_the_first_arrival() {
    let reqs = timed(&[10.0, 12.0, 11.0, 16.0]);
    let rules = OpenLoopRules {
        scale: 2.0,
        ..OpenLoopRules::default()
    };
    let mut e = OpenLoopReplay::new(reqs, rules).unwrap();
    e.start(100.0);
    assert_eq!(e.next_due(), Some(100.0));
    let first = e.pop_due(100.6);
    let got: Vec<(usize, f64)> = first.iter().map(|i| (i.session, i.send_at)).collect();
    assert_eq!(
        got,
        vec![(0, 100.0), (2, 100.5)],
        "sorted by arrival, twice the rate"
    );
    assert_eq!(first[0].max_tokens, 1);
    assert_eq!(e.pop_due(103.0).len(), 2);
    assert!(!e.is_finished());
    for i in &first {
        e.on_complete(i.id, 104.0).unwrap();
    }
    assert_eq!(
        e.on_complete(first[0].id, 104.0),
        Err(ReplayError::UnknownIssue(first[0].id))
    );
}

#[test]
fn open_loop_caps_count_and_duration() {
    let reqs = timed(&[0.0, 1.0, 2.0, 3.0, 4.0]);
    let mut by_count = OpenLoopReplay::new(
        reqs.clone(),
        OpenLoopRules {
            max_requests: Some(2),
            ..OpenLoopRules::default()
        },
    )
    .unwrap();
    by_count.start(0.0);
    assert_eq!(by_count.pop_due(100.0).len(), 2);
    let mut by_time = OpenLoopReplay::new(
        reqs,
        OpenLoopRules {
            scale: 0.5,
            max_duration_s: Some(4.0),
            ..OpenLoopRules::default()
        },
    )
    .unwrap();
    by_time.start(0.0);
    let sent = by_time.pop_due(100.0);
    let at: Vec<f64> = sent.iter().map(|i| i.send_at).collect();
    assert_eq!(at, vec![0.0, 2.0, 4.0], "half the rate, first 4 s");
    assert!(OpenLoopReplay::new(
        timed(&[0.0]),
        OpenLoopRules {
            scale: 0.0,
            ..OpenLoopRules::default()
        }
    )
    .is_err());
}

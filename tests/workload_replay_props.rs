//! Properties of the AgentX replay over random session trees, random rules and a random
//! (but reproducible) server.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use genslot::workload::{
    AgentxReplay, HashIds, Issue, Replay, ReplayRules, Request, Session, Subagent,
};
use proptest::prelude::*;

/// (gap before, api time) per request.
type Shape = Vec<(f64, f64)>;

fn build_chain(id: String, start: f64, shape: &Shape, next_input: &mut u32) -> Session {
    let mut t = start;
    let mut requests: Vec<Request> = Vec::new();
    for &(gap, api) in shape {
        if let Some(prev) = requests.last() {
            t = prev.recorded_end() + gap;
        }
        *next_input += 1;
        requests.push(Request {
            t,
            input_tokens: *next_input,
            output_tokens: 5,
            api_time: Some(api),
            think_time: None,
            hash_ids: HashIds::from_ids(&[1, 2]),
            streaming: false,
        });
    }
    Session {
        id,
        block_size: 64,
        requests,
        subagents: Vec::new(),
    }
}

fn sessions_strategy() -> impl Strategy<Value = Vec<Session>> {
    let shape = || prop::collection::vec((0.0..30.0f64, 0.0..5.0f64), 1..6);
    let tree = (shape(), prop::collection::vec((0usize..6, shape()), 0..3));
    prop::collection::vec(tree, 1..4).prop_map(|trees| {
        // Every request gets a distinct input size so the test can tell them apart.
        let mut next_input = 0u32;
        trees
            .into_iter()
            .enumerate()
            .map(|(i, (root, subs))| {
                let mut s = build_chain(format!("s{i}"), 0.0, &root, &mut next_input);
                let mut subs = subs;
                subs.sort_by_key(|(after, _)| *after);
                for (j, (after, shape)) in subs.into_iter().enumerate() {
                    let after = after.min(s.requests.len());
                    let spawn = after
                        .checked_sub(1)
                        .map_or(0.0, |k| s.requests[k].recorded_end() + 0.5);
                    let sub = build_chain(format!("s{i}/a{j}"), spawn, &shape, &mut next_input);
                    let end = sub.requests.last().map_or(spawn, Request::recorded_end);
                    s.subagents.push(Subagent {
                        after_request: after,
                        marker_t: end,
                        spawn_t: spawn,
                        end_t: end,
                        agent_id: format!("a{j}"),
                        subagent_type: "x".into(),
                        session: sub,
                    });
                }
                s
            })
            .collect()
    })
}

fn drive(e: &mut AgentxReplay, limit: usize) -> (Vec<Issue>, BTreeMap<u64, f64>) {
    e.start(0.0);
    let mut issues = Vec::new();
    let mut completed_at = BTreeMap::new();
    let mut done: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    while issues.len() < limit {
        let next_done = done.keys().next().map(|k| f64::from_bits(k.0));
        let now = match (e.next_due(), next_done) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        while let Some((&k, &id)) = done.iter().next() {
            if f64::from_bits(k.0) > now {
                break;
            }
            done.remove(&k);
            e.on_complete(id, now).unwrap();
            completed_at.insert(id, now);
        }
        for i in e.pop_due(now) {
            assert!(i.send_at <= now);
            let service = ((i.id.wrapping_mul(7919) % 13) as f64) * 0.5;
            done.insert(((now + service).to_bits(), i.id), i.id);
            issues.push(i);
        }
    }
    (issues, completed_at)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn replay_issues_each_request_once_per_tree_and_respects_chain_order(
        sessions in sessions_strategy(),
        concurrency in 1usize..4,
        start in 0.0..=1.0f64,
        warmup in any::<bool>(),
        cap in 0.0..20.0f64,
        seed in any::<u64>(),
    ) {
        let rules = ReplayRules { concurrency, start_fraction: (start, start), idle_cap_s: cap, warmup };
        let mut e = AgentxReplay::new(Arc::from(sessions.clone()), rules, seed).unwrap();
        let (issues, completed_at) = drive(&mut e, 150);

        let mut seen: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut by_instance: BTreeMap<u64, Vec<&Issue>> = BTreeMap::new();
        for i in &issues {
            prop_assert!(i.lane.is_some_and(|l| l < concurrency));
            prop_assert!(seen.insert((i.instance, i.input_tokens)), "a request issued twice in one tree");
            by_instance.entry(i.instance).or_default().push(i);
        }
        let lanes_first: BTreeSet<u64> = (0..concurrency as u64).collect();
        for (instance, list) in &by_instance {
            let session = &sessions[list[0].session];
            // A root request is never sent before the previous root request completed.
            let root: Vec<&Request> = session.requests.iter().collect();
            for w in root.windows(2) {
                let find = |r: &Request| list.iter().find(|i| i.input_tokens == r.input_tokens);
                if let (Some(a), Some(b)) = (find(w[0]), find(w[1])) {
                    let done = completed_at.get(&a.id).copied();
                    prop_assert!(done.is_some_and(|d| b.send_at >= d));
                }
            }
            let warmups = list.iter().filter(|i| i.warmup).count();
            prop_assert!(warmups <= 1);
            if !lanes_first.contains(instance) {
                prop_assert_eq!(warmups, 0, "only a lane's first tree warms up");
            }
        }
        // A tree that is finished (a later tree exists on its lane) issued all its requests,
        // unless it was a lane's first tree (cut at the random start point).
        let mut lane_trees: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for i in &issues {
            let v = lane_trees.entry(i.lane.unwrap_or(usize::MAX)).or_default();
            if v.last() != Some(&i.instance) { v.push(i.instance); }
        }
        for trees in lane_trees.values() {
            for &inst in trees.iter().skip(1).take(trees.len().saturating_sub(2)) {
                let list = &by_instance[&inst];
                prop_assert_eq!(list.len(), sessions[list[0].session].total_requests());
            }
        }
    }
}

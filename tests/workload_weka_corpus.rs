//! The shared Weka corpus (`../shared/traces/weka_cc_agentic`), when present. Skips with a
//! message when the folder is absent (as in CI).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use genslot::workload::{load_trace, AgentxReplay, Replay, ReplayRules, Session, Trace};

/// Loaded once for all tests of this file.
fn corpus() -> Option<&'static [Session]> {
    static CORPUS: OnceLock<Option<Vec<Session>>> = OnceLock::new();
    CORPUS.get_or_init(load).as_deref()
}

fn load() -> Option<Vec<Session>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/weka_cc_agentic");
    let file = dir.join("weka_traces_runs.jsonl.gz");
    if !file.exists() {
        eprintln!("skipped: {} is absent", file.display());
        return None;
    }
    match load_trace(&file, None) {
        Ok(Trace::Sessions(s)) => Some(s),
        Ok(other) => panic!("corpus detected as {:?}", other.format()),
        Err(e) => panic!("corpus failed to load: {e}"),
    }
}

#[test]
fn corpus_has_710_traces_and_49334_requests_with_63_subagents() {
    let Some(sessions) = corpus() else { return };
    assert_eq!(sessions.len(), 710);
    let requests: usize = sessions.iter().map(Session::total_requests).sum();
    assert_eq!(requests, 49_334);
    let subagents: usize = sessions.iter().map(Session::total_subagents).sum();
    assert_eq!(subagents, 63);
    let sub_requests: usize = sessions
        .iter()
        .flat_map(|s| s.all_requests())
        .filter(|(depth, _)| *depth > 0)
        .count();
    assert_eq!(sub_requests, 676);
    assert_eq!(
        sessions.iter().filter(|s| !s.subagents.is_empty()).count(),
        17
    );
    assert!(sessions.iter().all(|s| s.block_size == 64));
}

/// Evidence for the sub-agent time base in `weka`: a completed sub-agent starts
/// `duration_ms` before its marker, right after the parent request that launched it.
#[test]
fn completed_subagents_start_right_after_the_parent_request_that_launched_them() {
    let Some(sessions) = corpus() else { return };
    let (mut launched, mut right_after) = (0, 0);
    for s in sessions {
        for sub in &s.subagents {
            let Some(parent) = sub.after_request.checked_sub(1).map(|i| &s.requests[i]) else {
                continue;
            };
            if sub.spawn_t == sub.marker_t {
                continue; // no duration recorded (async launch)
            }
            launched += 1;
            let lag = sub.spawn_t - parent.recorded_end();
            if (0.0..=2.0).contains(&lag) {
                right_after += 1;
            }
        }
    }
    assert_eq!(launched, 59);
    assert!(right_after >= 57, "{right_after} of {launched}");
}

#[test]
fn every_request_has_about_one_hash_block_per_64_input_tokens() {
    let Some(sessions) = corpus() else { return };
    for s in sessions {
        for (_, r) in s.all_requests() {
            let blocks = r.hash_ids.len() as u64;
            let want = u64::from(r.input_tokens).div_ceil(64);
            assert!(
                blocks.abs_diff(want) <= 1,
                "{}: {} blocks for {} tokens",
                s.id,
                blocks,
                r.input_tokens
            );
        }
    }
}

#[test]
fn the_corpus_replays_at_220_lanes_with_one_warmup_per_lane() {
    let Some(sessions) = corpus() else { return };
    let rules = ReplayRules {
        concurrency: 220,
        ..ReplayRules::default()
    };
    let mut e = AgentxReplay::new(Arc::from(sessions.to_vec()), rules, 1).unwrap();
    e.start(0.0);
    // A server that takes 1 s plus 20 ms per output token.
    let mut done: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let (mut sent, mut warmups, mut subagent_issues) = (0usize, 0usize, 0usize);
    while sent < 20_000 {
        let next_done = done.keys().next().map(|k| f64::from_bits(k.0));
        let now = match (e.next_due(), next_done) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).expect("a closed loop always has work"),
        };
        while let Some((&k, &id)) = done.iter().next() {
            if f64::from_bits(k.0) > now {
                break;
            }
            done.remove(&k);
            e.on_complete(id, now).unwrap();
        }
        for i in e.pop_due(now) {
            assert!(i.lane.is_some_and(|l| l < 220));
            warmups += usize::from(i.warmup);
            subagent_issues += usize::from(i.depth > 0);
            let end = now + 1.0 + 0.02 * f64::from(i.max_tokens);
            done.insert((end.to_bits(), i.id), i.id);
            sent += 1;
        }
    }
    // Every corpus session has at least 3 turns at distinct times, so a random start point
    // almost surely leaves a turn before it: one warm-up per lane, only for its first session.
    assert_eq!(warmups, 220);
    assert!(subagent_issues > 0, "sub-agent requests are replayed");
}

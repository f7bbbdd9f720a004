//! The synthetic agentic generator reproduces the Weka corpus' shape. The quantiles quoted
//! are the corpus' (`requests.csv`, `traces.csv`); tolerances are looser for input tokens,
//! which the model derives rather than draws (3000 sessions, seed 7, measured: input p50
//! 93k, p90 261k).

use genslot::workload::{Session, SynthParams, SyntheticAgentic};

fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let k = (v.len() - 1) as f64 * p;
    let (lo, hi) = (k.floor() as usize, k.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (k - lo as f64)
}

fn within(got: f64, want: f64, tol: f64, what: &str) {
    let rel = (got - want).abs() / want;
    assert!(
        rel <= tol,
        "{what}: got {got:.1}, corpus {want:.1} (off {:.0} %, allowed {:.0} %)",
        rel * 100.0,
        tol * 100.0
    );
}

/// Generated once for all tests of this file.
fn sample() -> &'static [Session] {
    static SAMPLE: std::sync::OnceLock<Vec<Session>> = std::sync::OnceLock::new();
    SAMPLE.get_or_init(|| SyntheticAgentic::new(SynthParams::default()).generate(3000, 7))
}

#[test]
fn synthetic_sessions_match_the_corpus_medians_and_p90() {
    let sessions = sample();
    let mut turns: Vec<f64> = sessions.iter().map(|s| s.requests.len() as f64).collect();
    within(quantile(&mut turns, 0.5), 45.0, 0.15, "turns p50");
    within(quantile(&mut turns, 0.9), 155.1, 0.10, "turns p90");

    let reqs: Vec<_> = sessions.iter().flat_map(|s| s.all_requests()).collect();
    let mut input: Vec<f64> = reqs
        .iter()
        .map(|(_, r)| f64::from(r.input_tokens))
        .collect();
    within(quantile(&mut input, 0.5), 103_659.0, 0.15, "input p50");
    within(quantile(&mut input, 0.9), 233_633.0, 0.20, "input p90");

    let main: Vec<_> = reqs.iter().filter(|(d, _)| *d == 0).collect();
    let mut out: Vec<f64> = main
        .iter()
        .map(|(_, r)| f64::from(r.output_tokens))
        .collect();
    within(quantile(&mut out, 0.5), 216.0, 0.10, "output p50");
    within(quantile(&mut out, 0.9), 899.0, 0.10, "output p90");

    let mut api: Vec<f64> = reqs.iter().filter_map(|(_, r)| r.api_time).collect();
    within(quantile(&mut api, 0.5), 6.08, 0.10, "api time p50");

    let mut gaps = Vec::new();
    for s in sessions {
        for (k, w) in s.requests.windows(2).enumerate() {
            // Skip turns that waited for sub-agents: their gap runs from the join.
            if !s.subagents.iter().any(|sub| sub.after_request == k + 1) {
                gaps.push((w[1].t - w[0].recorded_end()).max(0.0));
            }
        }
    }
    within(quantile(&mut gaps, 0.5), 9.7, 0.10, "gap p50");
    within(quantile(&mut gaps, 0.9), 120.0, 0.15, "gap p90");

    let subagents: usize = sessions.iter().map(Session::total_subagents).sum();
    assert!(subagents > 0, "a 3000-session sample has sub-agents");
}

#[test]
fn synthetic_turns_extend_the_previous_prefix() {
    let sessions = sample();
    let s = sessions.iter().find(|s| s.requests.len() > 5).unwrap();
    for w in s.requests.windows(2) {
        let keep = (w[0].input_tokens / 64) as usize;
        assert_eq!(w[1].hash_ids.prefix(keep), w[0].hash_ids.prefix(keep));
        assert_eq!(w[1].hash_ids.len(), w[1].input_tokens.div_ceil(64) as usize);
    }
}

#[test]
fn the_same_seed_gives_the_same_sessions() {
    let g = SyntheticAgentic::new(SynthParams::default());
    assert_eq!(g.generate(50, 3), g.generate(50, 3));
    assert_ne!(g.generate(50, 3), g.generate(50, 4));
}

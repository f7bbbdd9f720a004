//! Synthetic agentic sessions whose shape is fitted to the shared Weka corpus
//! (`weka_cc_agentic`: 710 Claude Code traces, 48,658 main-chain and 676 sub-agent
//! requests), so the simulator and load generator work with no data file.
//!
//! # Model
//! Per session, with independent draws except where noted:
//! - turns `n` from [`SynthParams::turns`] and first input `x0` from
//!   [`SynthParams::first_input`], coupled by a Gaussian copula with `rho = -0.34` (the
//!   corpus has Spearman −0.33: sessions that start large are short; without it the
//!   per-request input p90 lands near 330k instead of 234k);
//! - a peak context `M` from [`SynthParams::peak_input`] (at least `x0`); per-turn growth
//!   steps `d_k` from [`SynthParams::growth`]; turn `k` has input
//!   `x0 + (M - x0) * S_k / S_{n-1}` with `S_k = d_1 + … + d_k`, so growth is bursty like
//!   the trace and the session ends at its peak (context compaction is not modelled);
//! - output tokens from [`SynthParams::output`], API time from [`SynthParams::api_time`],
//!   end-to-start gap from [`SynthParams::gap`]; `t_k = t_{k-1} + api_{k-1} + gap_k`;
//! - prefix blocks of 64 tokens: each turn keeps the previous turn's full blocks and
//!   appends fresh ids (ideal prefix reuse, as in 96 % of the corpus' input tokens);
//! - after each parent turn, a sub-agent spawn event with probability 38 / 48,658 (the
//!   corpus' spawn events per main-chain turn), spawning 1, 2 or 3 parallel sub-agents
//!   with weights 21 : 9 : 8; sub-agents draw turns, first input and output from their
//!   own tables, grow by [`SynthParams::growth`] steps, and the parent resumes one gap
//!   after the last of them ends.
//!
//! # Fit
//! Every table is the corpus' empirical quantiles at p = 0, 1, 5, 10, 25, 50, 75, 90, 95,
//! 99, 100 (linear interpolation between order statistics), computed once from
//! `requests.csv` (per-request columns; gaps as `t_k − t_{k−1} − api_time_{k−1}` on each
//! main chain, clamped at 0; growth as the positive input deltas between consecutive
//! main-chain requests, with extra knots at p = 99.5 and 99.9 because the 99–100 % tail spans
//! 16k–637k) and `traces.csv` (turns = `n_requests_parent`, first input = `first_in`; peak =
//! the largest main-chain input per trace from `requests.csv`). Samples are log-linear
//! between knots, so every knot quantile of a directly drawn quantity is reproduced.
//! Input tokens per request are derived, not drawn; the copula `rho` was chosen so they land
//! near the corpus (all requests: p50 104k, p90 234k). Measured on 3000 sessions, seed 7:
//! turns p50 45 / p90 160 (corpus 45 / 155), input p50 93k / p90 261k, main-chain output
//! p50 215 / p90 897 (216 / 899), gap p50 9.7 s / p90 120 s (9.7 / 120); checked in
//! `tests/workload_synth.rs`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::quantile::{normal_cdf, QuantileTable};
use super::types::{HashIds, Request, Session, Subagent};

const P: [f64; 11] = [
    0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 1.0,
];

fn table(values: [f64; 11]) -> QuantileTable {
    let knots: Vec<(f64, f64)> = P.iter().copied().zip(values).collect();
    QuantileTable::new(&knots).unwrap_or_else(|| unreachable!("fitted tables are CDFs"))
}

/// Parameters of the synthetic generator. `Default` is the fit to the Weka corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthParams {
    /// Main-chain requests per session.
    pub turns: QuantileTable,
    /// Input tokens of a session's first request.
    pub first_input: QuantileTable,
    /// Largest input of a session.
    pub peak_input: QuantileTable,
    /// Gaussian-copula correlation between `turns` and `first_input`.
    pub turns_first_input_rho: f64,
    /// Relative size of one turn's input growth (positive main-chain deltas, tokens).
    pub growth: QuantileTable,
    /// Output tokens per main-chain request.
    pub output: QuantileTable,
    /// Recorded API time per request, seconds.
    pub api_time: QuantileTable,
    /// End-to-start gap before a request, seconds.
    pub gap: QuantileTable,
    /// Probability that a parent turn is followed by a sub-agent spawn event.
    pub spawn_prob: f64,
    /// Relative weights of spawning 1, 2, 3, … sub-agents in one event.
    pub spawn_group_weights: Vec<f64>,
    pub subagent_turns: QuantileTable,
    pub subagent_first_input: QuantileTable,
    pub subagent_output: QuantileTable,
    /// Largest input a request may have.
    pub max_input: u32,
    pub block_size: u32,
}

impl Default for SynthParams {
    fn default() -> Self {
        let growth_knots = [
            (0.0, 6.0),
            (0.01, 109.0),
            (0.05, 154.0),
            (0.10, 192.0),
            (0.25, 331.0),
            (0.50, 655.0),
            (0.75, 1551.0),
            (0.90, 3540.5),
            (0.95, 6161.75),
            (0.99, 16433.25),
            (0.995, 24111.0),
            (0.999, 78600.6),
            (1.0, 636943.0),
        ];
        Self {
            turns: table([
                3.0, 3.0, 4.0, 7.0, 18.0, 45.0, 94.0, 155.1, 231.55, 329.46, 514.0,
            ]),
            first_input: table([
                6343.0, 10245.4, 13048.0, 15457.7, 18599.8, 24454.0, 104057.5, 258903.0, 374960.2,
                708057.2, 851858.0,
            ]),
            peak_input: table([
                11053.0, 19281.8, 48152.0, 66872.3, 111956.3, 147761.5, 186105.3, 339673.3,
                467741.3, 790817.3, 894371.0,
            ]),
            turns_first_input_rho: -0.34,
            growth: QuantileTable::new(&growth_knots)
                .unwrap_or_else(|| unreachable!("fitted tables are CDFs")),
            output: table([
                0.0, 58.0, 89.0, 105.0, 137.0, 216.0, 429.0, 899.0, 1543.2, 3663.0, 18195.0,
            ]),
            api_time: table([
                0.79, 2.38, 2.97, 3.37, 4.293, 6.08, 10.26, 18.349, 28.489, 60.694, 300.03,
            ]),
            gap: table([
                0.0, 2.42, 3.46, 4.09, 5.68, 9.7, 23.67, 120.02, 299.03, 2181.75, 77589.75,
            ]),
            spawn_prob: 38.0 / 48_658.0,
            spawn_group_weights: vec![21.0, 9.0, 8.0],
            subagent_turns: table([2.0, 3.24, 4.0, 5.0, 7.0, 11.0, 13.0, 17.0, 21.7, 24.0, 24.0]),
            subagent_first_input: table([
                8868.0, 8933.7, 9020.6, 9171.4, 9847.0, 10335.0, 11695.0, 12174.2, 13364.7,
                18254.0, 18259.0,
            ]),
            subagent_output: table([
                62.0, 86.0, 111.75, 131.0, 176.0, 235.0, 306.25, 524.5, 2977.25, 4761.25, 9829.0,
            ]),
            max_input: 1_000_000,
            block_size: 64,
        }
    }
}

/// Seeded generator of synthetic agentic sessions.
#[derive(Debug, Clone)]
pub struct SyntheticAgentic {
    params: SynthParams,
}

impl SyntheticAgentic {
    pub fn new(params: SynthParams) -> Self {
        Self { params }
    }

    pub fn params(&self) -> &SynthParams {
        &self.params
    }

    /// `count` sessions; the same seed gives the same sessions.
    pub fn generate(&self, count: usize, seed: u64) -> Vec<Session> {
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..count)
            .map(|i| self.session(&mut rng, format!("synth_{seed}_{i}")))
            .collect()
    }

    fn session(&self, rng: &mut SmallRng, id: String) -> Session {
        let p = &self.params;
        let (z1, z2) = (gauss(rng), gauss(rng));
        let rho = p.turns_first_input_rho.clamp(-1.0, 1.0);
        let z2 = rho * z1 + (1.0 - rho * rho).sqrt() * z2;
        let n = (p.turns.at(normal_cdf(z1)).round() as usize).max(1);
        let x0 = p.first_input.at(normal_cdf(z2)).max(1.0);
        let peak = p.peak_input.at(rng.random()).max(x0);
        let steps: Vec<f64> = (1..n).map(|_| p.growth.at(rng.random())).collect();
        let total: f64 = steps.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let mut inputs = Vec::with_capacity(n);
        inputs.push(x0);
        let mut acc = 0.0;
        for s in &steps {
            acc += s;
            inputs.push(x0 + (peak - x0) * acc / total);
        }

        let mut ids = IdSource::new(0);
        let mut requests: Vec<Request> = Vec::with_capacity(n);
        let mut subagents = Vec::new();
        let mut t = 0.0;
        let mut prev_hash = HashIds::default();
        let mut prev_input = 0u32;
        let mut sub_ids = 1u64;
        for (k, &x) in inputs.iter().enumerate() {
            let input = self.clamp_input(x);
            let gap = if k == 0 { 0.0 } else { p.gap.at(rng.random()) };
            if let Some(prev) = requests.last() {
                let resume = subagents
                    .iter()
                    .filter(|s: &&Subagent| s.after_request == k)
                    .map(|s| s.end_t)
                    .fold(prev.recorded_end(), f64::max);
                t = resume + gap;
            }
            let hash_ids = ids.extend(&prev_hash, prev_input, input, p.block_size);
            let req = Request {
                t,
                input_tokens: input,
                output_tokens: p.output.at(rng.random()).round() as u32,
                api_time: Some(p.api_time.at(rng.random())),
                think_time: Some(gap),
                hash_ids: hash_ids.clone(),
                streaming: false,
            };
            let end = req.recorded_end();
            requests.push(req);
            prev_hash = hash_ids;
            prev_input = input;
            if k + 1 < n && rng.random::<f64>() < p.spawn_prob {
                let group = pick_weighted(rng, &p.spawn_group_weights) + 1;
                for _ in 0..group {
                    let sub = self.subagent(rng, &id, k + 1, end, sub_ids);
                    sub_ids += 1;
                    subagents.push(sub);
                }
            }
        }
        Session {
            id,
            block_size: p.block_size,
            requests,
            subagents,
        }
    }

    fn subagent(
        &self,
        rng: &mut SmallRng,
        parent: &str,
        after_request: usize,
        parent_end: f64,
        n: u64,
    ) -> Subagent {
        let p = &self.params;
        let turns = (p.subagent_turns.at(rng.random()).round() as usize).max(1);
        // Sub-agent ids live in their own range of the parent's namespace.
        let mut ids = IdSource::new(n << 40);
        let spawn_t = parent_end + p.gap.at(rng.random()).min(1.0);
        let mut t = spawn_t;
        let mut x = p.subagent_first_input.at(rng.random());
        let mut requests: Vec<Request> = Vec::with_capacity(turns);
        let mut prev_hash = HashIds::default();
        let mut prev_input = 0;
        for k in 0..turns {
            if k > 0 {
                x += p.growth.at(rng.random());
            }
            let gap = if k == 0 { 0.0 } else { p.gap.at(rng.random()) };
            if let Some(prev) = requests.last() {
                t = prev.recorded_end() + gap;
            }
            let input = self.clamp_input(x);
            let hash_ids = ids.extend(&prev_hash, prev_input, input, p.block_size);
            requests.push(Request {
                t,
                input_tokens: input,
                output_tokens: p.subagent_output.at(rng.random()).round() as u32,
                api_time: Some(p.api_time.at(rng.random())),
                think_time: Some(gap),
                hash_ids: hash_ids.clone(),
                streaming: false,
            });
            prev_hash = hash_ids;
            prev_input = input;
        }
        let end_t = requests.last().map_or(spawn_t, Request::recorded_end);
        let agent_id = format!("agent_{n:03}");
        Subagent {
            after_request,
            marker_t: end_t,
            spawn_t,
            end_t,
            session: Session {
                id: format!("{parent}/{agent_id}"),
                block_size: p.block_size,
                requests,
                subagents: Vec::new(),
            },
            agent_id,
            subagent_type: "synthetic".into(),
        }
    }

    fn clamp_input(&self, x: f64) -> u32 {
        (x.round().max(1.0) as u32).min(self.params.max_input)
    }
}

/// Hands out fresh block ids for a growing context.
struct IdSource {
    next: u64,
}

impl IdSource {
    fn new(first: u64) -> Self {
        Self { next: first }
    }

    /// Blocks for `input` tokens: the previous turn's full blocks, then fresh ids.
    fn extend(&mut self, prev: &HashIds, prev_input: u32, input: u32, block: u32) -> HashIds {
        let blocks = input.div_ceil(block) as usize;
        let keep = ((prev_input / block) as usize).min(blocks);
        let mut out = prev.prefix(keep);
        let fresh = (blocks - keep) as u32;
        out.push_range(self.next, fresh);
        self.next += u64::from(fresh);
        out
    }
}

fn gauss(rng: &mut SmallRng) -> f64 {
    // Box–Muller; `1 - u` keeps the log argument in (0, 1].
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn pick_weighted(rng: &mut SmallRng, weights: &[f64]) -> usize {
    let total: f64 = weights.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i;
        }
        u -= w;
    }
    weights.len().saturating_sub(1)
}

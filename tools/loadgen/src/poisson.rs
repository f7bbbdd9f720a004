//! Open-loop Poisson arrivals at a fixed request rate (`--request-rate`), for the fixed-length
//! and synthetic loads.
//!
//! Closed-loop lanes send when a response ends, so their sends carry the phase of the server's
//! decode steps and TTFT depends on where each tool's sends fall against the step boundary.
//! Poisson arrivals are independent of the server: inter-arrival times are exponential with
//! mean `1 / rate`, drawn from the seed alone, and no send waits for a response.
//!
//! With a concurrency cap the arrivals follow AIPerf's `--request-rate` with `--concurrency`:
//! an arrival that finds `cap` requests in flight is skipped, not queued (AIPerf's rate loop
//! moves on to the next interval when no session slot is free), and a skipped arrival does
//! not use up a request shape.

use std::collections::BTreeSet;

use crate::jitter::{mix, unit};
use crate::source::{Job, Source};

/// Keeps the arrival stream apart from the other uses of `--seed` (prompts, jitter, sessions).
const STREAM: u64 = 0x706f_6973_736f_6e01;

/// Why a request rate cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("--request-rate must be a positive, finite number of requests per second, got {0}")]
pub struct BadRate(pub f64);

/// The seeded arrival process: the `k`-th inter-arrival time depends only on the seed and `k`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoissonArrivals {
    rate: f64,
    seed: u64,
}

impl PoissonArrivals {
    pub fn new(rate: f64, seed: u64) -> Result<Self, BadRate> {
        if rate.is_finite() && rate > 0.0 {
            Ok(Self { rate, seed })
        } else {
            Err(BadRate(rate))
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The `k`-th inter-arrival time (0-based; the 0-th is from the start to the first
    /// arrival), in seconds: exponential with mean `1 / rate`.
    pub fn interval(&self, k: u64) -> f64 {
        // u is in [0, 1), so 1 - u is in (0, 1] and ln is finite.
        let u = unit(mix(mix(self.seed ^ STREAM) ^ k));
        -(1.0 - u).ln() / self.rate
    }
}

/// What one request looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub hash_ids: Vec<u64>,
    pub block_size: u32,
    /// Synthetic session the request was taken from.
    pub session: Option<usize>,
}

/// The requests the arrivals carry, taken in order and cycled.
#[derive(Debug, Clone, PartialEq)]
pub enum Shapes {
    /// Every request has `input` prompt and `output` output tokens (AIPerf's `--isl/--osl`).
    Fixed { input: u32, output: u32 },
    /// The requests of a pool (e.g. every request of the synthetic sessions, depth first),
    /// one per arrival; after the last one the pool starts again under a new prefix salt.
    Pool(Vec<Shape>),
}

impl Shapes {
    /// The `n`-th request and the pass through the pool it belongs to.
    fn get(&self, n: u64) -> (Shape, u64) {
        match self {
            Shapes::Fixed { input, output } => (
                Shape {
                    input_tokens: *input,
                    output_tokens: *output,
                    hash_ids: Vec::new(),
                    block_size: 64,
                    session: None,
                },
                0,
            ),
            Shapes::Pool(pool) if !pool.is_empty() => {
                let len = pool.len() as u64;
                (pool[(n % len) as usize].clone(), n / len)
            }
            // An empty pool cannot be built by `PoissonSource::new`; a 1-token request keeps
            // this total without a panic path.
            Shapes::Pool(_) => (
                Shape {
                    input_tokens: 1,
                    output_tokens: 1,
                    hash_ids: Vec::new(),
                    block_size: 64,
                    session: None,
                },
                0,
            ),
        }
    }
}

/// Why a Poisson source cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoissonError {
    #[error(transparent)]
    Rate(#[from] BadRate),
    #[error("the request pool is empty")]
    EmptyPool,
    #[error("--concurrency with --request-rate caps in-flight requests and must be at least 1")]
    ZeroCap,
}

/// Open-loop source: one request per Poisson arrival, optionally capped in flight.
#[derive(Debug, Clone)]
pub struct PoissonSource {
    arrivals: PoissonArrivals,
    shapes: Shapes,
    cap: Option<usize>,
    seed: u64,
    /// Arrivals drawn so far (sent or skipped).
    drawn: u64,
    /// When the next arrival is due (run seconds).
    next_at: f64,
    /// Requests sent so far; also the next job id and the index into `shapes`.
    sent: u64,
    skipped: u64,
    in_flight: BTreeSet<u64>,
}

impl PoissonSource {
    pub fn new(
        arrivals: PoissonArrivals,
        shapes: Shapes,
        cap: Option<usize>,
        seed: u64,
    ) -> Result<Self, PoissonError> {
        if matches!(&shapes, Shapes::Pool(p) if p.is_empty()) {
            return Err(PoissonError::EmptyPool);
        }
        if cap == Some(0) {
            return Err(PoissonError::ZeroCap);
        }
        Ok(Self {
            arrivals,
            shapes,
            cap,
            seed,
            drawn: 0,
            next_at: 0.0,
            sent: 0,
            skipped: 0,
            in_flight: BTreeSet::new(),
        })
    }

    /// Arrivals dropped because `cap` requests were in flight.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    fn job(&mut self, send_at: f64) -> Job {
        let id = self.sent;
        self.sent += 1;
        let (shape, pass) = self.shapes.get(id);
        self.in_flight.insert(id);
        Job {
            id,
            lane: None,
            session: shape.session,
            conversation: None,
            input_tokens: shape.input_tokens,
            max_tokens: shape.output_tokens.max(1),
            hash_ids: shape.hash_ids,
            block_size: shape.block_size,
            // Each pass through a pool is an independent replay for the prefix cache.
            prefix_salt: if pass == 0 {
                self.seed
            } else {
                mix(self.seed ^ mix(pass))
            },
            warmup: false,
            send_at,
        }
    }
}

impl Source for PoissonSource {
    fn start(&mut self, now: f64) {
        self.drawn = 1;
        self.next_at = now + self.arrivals.interval(0);
    }

    fn next_due(&self) -> Option<f64> {
        Some(self.next_at)
    }

    fn pop_due(&mut self, now: f64) -> Vec<Job> {
        let mut due = Vec::new();
        while self.next_at <= now {
            let at = self.next_at;
            if self.cap.is_some_and(|c| self.in_flight.len() >= c) {
                self.skipped += 1;
            } else {
                due.push(self.job(at));
            }
            self.next_at += self.arrivals.interval(self.drawn);
            self.drawn += 1;
        }
        due
    }

    fn on_complete(&mut self, id: u64, _now: f64) {
        self.in_flight.remove(&id);
    }

    fn open_loop(&self) -> bool {
        true
    }

    fn skipped_arrivals(&self) -> u64 {
        self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(rate: f64, cap: Option<usize>, seed: u64) -> PoissonSource {
        let arrivals = PoissonArrivals::new(rate, seed).expect("rate");
        let shapes = Shapes::Fixed {
            input: 64,
            output: 32,
        };
        PoissonSource::new(arrivals, shapes, cap, seed).expect("source")
    }

    #[test]
    fn rates_that_are_not_positive_and_finite_are_refused() {
        for r in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(PoissonArrivals::new(r, 0).is_err(), "{r}");
        }
        assert!(PoissonArrivals::new(1e-3, 0).is_ok());
    }

    #[test]
    fn inter_arrival_times_are_exponential_with_mean_one_over_the_rate() {
        // For an exponential law the standard deviation equals the mean, so the sample mean
        // of n draws has standard error mean / sqrt(n); 5 standard errors is far outside
        // chance, and the draws are fixed by the seed, so the test cannot flake.
        let n = 200_000u64;
        for (rate, seed) in [(13.3, 0), (0.5, 7), (1000.0, 42)] {
            let a = PoissonArrivals::new(rate, seed).expect("rate");
            let draws: Vec<f64> = (0..n).map(|k| a.interval(k)).collect();
            let mean = draws.iter().sum::<f64>() / n as f64;
            let var = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let expected = 1.0 / rate;
            let se = expected / (n as f64).sqrt();
            assert!(
                (mean - expected).abs() < 5.0 * se,
                "rate {rate}: mean {mean}, expected {expected} ± {}",
                5.0 * se
            );
            // Not evenly spaced: an exponential's std is its mean (a constant rate's is 0).
            let std = var.sqrt();
            assert!(
                (std / expected - 1.0).abs() < 0.02,
                "rate {rate}: std {std}"
            );
            assert!(draws.iter().all(|d| d.is_finite() && *d >= 0.0));
        }
    }

    #[test]
    fn the_schedule_is_a_function_of_the_seed_alone() {
        let sched = |seed| {
            let mut s = fixed(50.0, None, seed);
            s.start(0.0);
            s.pop_due(10.0)
                .iter()
                .map(|j| j.send_at)
                .collect::<Vec<_>>()
        };
        assert_eq!(sched(3), sched(3));
        assert_ne!(sched(3), sched(4));
        assert!(sched(3).len() > 400, "about 500 arrivals in 10 s at 50/s");
    }

    #[test]
    fn arrivals_keep_coming_while_earlier_requests_are_in_flight() {
        let mut s = fixed(100.0, None, 1);
        s.start(0.0);
        let jobs = s.pop_due(1.0);
        assert!(jobs.len() > 50, "{} arrivals in 1 s at 100/s", jobs.len());
        assert!(jobs.iter().all(|j| j.lane.is_none() && !j.warmup));
        assert!(jobs.windows(2).all(|w| w[0].send_at <= w[1].send_at));
        assert!(s.next_due().is_some_and(|t| t > 1.0));
        assert_eq!(s.skipped(), 0);
    }

    #[test]
    fn a_capped_source_skips_arrivals_that_find_the_cap_in_flight() {
        let mut capped = fixed(100.0, Some(2), 1);
        let mut free = fixed(100.0, None, 1);
        capped.start(0.0);
        free.start(0.0);
        let all = free.pop_due(1.0);
        let sent = capped.pop_due(1.0);
        assert_eq!(sent.len(), 2);
        assert_eq!(capped.skipped() as usize, all.len() - 2);
        // The sent ones are the first two arrivals; a completion frees one slot, and the next
        // arrival after it is sent with the next shape and id, not a skipped arrival's.
        assert_eq!(sent[0].send_at, all[0].send_at);
        assert_eq!(sent[1].send_at, all[1].send_at);
        capped.on_complete(sent[0].id, 1.0);
        let next = capped.pop_due(2.0);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].id, 2);
        assert!(next[0].send_at > 1.0);
    }

    #[test]
    fn a_pool_is_taken_in_order_and_each_pass_gets_its_own_prefix_salt() {
        let shape = |isl| Shape {
            input_tokens: isl,
            output_tokens: 3,
            hash_ids: vec![isl.into()],
            block_size: 64,
            session: Some(isl as usize),
        };
        let arrivals = PoissonArrivals::new(1000.0, 5).expect("rate");
        let pool = Shapes::Pool(vec![shape(10), shape(20)]);
        let mut s = PoissonSource::new(arrivals, pool, None, 5).expect("source");
        s.start(0.0);
        let jobs = s.pop_due(1.0);
        let isl: Vec<u32> = jobs.iter().take(4).map(|j| j.input_tokens).collect();
        assert_eq!(isl, [10, 20, 10, 20]);
        assert_eq!(jobs[0].prefix_salt, jobs[1].prefix_salt);
        assert_ne!(jobs[0].prefix_salt, jobs[2].prefix_salt);
        assert_eq!(jobs[2].prefix_salt, jobs[3].prefix_salt);
    }

    #[test]
    fn an_empty_pool_or_a_zero_cap_is_refused() {
        let a = PoissonArrivals::new(1.0, 0).expect("rate");
        assert_eq!(
            PoissonSource::new(a.clone(), Shapes::Pool(vec![]), None, 0).err(),
            Some(PoissonError::EmptyPool)
        );
        let f = Shapes::Fixed {
            input: 1,
            output: 1,
        };
        assert_eq!(
            PoissonSource::new(a, f, Some(0), 0).err(),
            Some(PoissonError::ZeroCap)
        );
    }
}

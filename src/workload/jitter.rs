//! Seeded send jitter for closed-loop lanes.
//!
//! A lane that sends the instant its previous response ends is phase-locked to the server's
//! decode loop: the last token and `[DONE]` leave at the end of a decode step, so every next
//! request arrives just after a step boundary and waits the longest possible for admission.
//! Arrivals at a real GEN server carry no such phase (they come from prefill servers and many
//! users), and AIPerf's lanes do not have it either: its credit round trip between processes
//! puts a variable delay between one response's end and the lane's next send. So each
//! closed-loop send waits an extra delay drawn uniformly from `[0, max)`.
//!
//! A draw depends only on the seed, the lane and how many of that lane's requests have
//! completed, never on the server's timing, so a seed fixes the whole jitter sequence. The
//! load generator adds it in real time and the simulator (`sim --send-jitter`) in virtual
//! time, from this one draw, so a simulated run's lanes wait what the same seed's loadgen
//! lanes wait.

use std::collections::BTreeMap;
use std::time::Duration;

/// Keeps the jitter stream apart from the other uses of `--seed` (prompts, session draws).
const STREAM: u64 = 0x6a69_7474_6572_0001;

/// SplitMix64's output function: a bijective 64-bit mixer.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform f64 in [0, 1) from a mixed hash: its top 53 bits.
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Per-lane send jitter of a run.
#[derive(Debug, Clone)]
pub struct SendJitter {
    max_s: f64,
    seed: u64,
    /// Completions seen so far per lane (the index of the next draw).
    completed: BTreeMap<usize, u64>,
}

impl SendJitter {
    /// Jitter uniform in `[0, max)`; `max` of zero sends back to back.
    pub fn new(max: Duration, seed: u64) -> Self {
        Self {
            max_s: max.as_secs_f64(),
            seed,
            completed: BTreeMap::new(),
        }
    }

    /// The delay (seconds) between `lane`'s `n`-th completion (0-based) and its next send.
    pub fn draw(max: Duration, seed: u64, lane: usize, n: u64) -> f64 {
        let max_s = max.as_secs_f64();
        if max_s <= 0.0 {
            return 0.0;
        }
        unit(mix(mix(mix(seed ^ STREAM) ^ lane as u64) ^ n)) * max_s
    }

    /// The delay before `lane`'s next send, for the completion that just happened.
    pub fn next(&mut self, lane: usize) -> f64 {
        let n = self.completed.entry(lane).or_insert(0);
        let d = Self::draw(Duration::from_secs_f64(self.max_s), self.seed, lane, *n);
        *n += 1;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_jitter_never_delays() {
        let mut j = SendJitter::new(Duration::ZERO, 9);
        assert!((0..100).all(|_| j.next(3) == 0.0));
    }

    #[test]
    fn draws_stay_below_the_maximum_and_spread_over_it() {
        let max = Duration::from_millis(40);
        let draws: Vec<f64> = (0..2000)
            .map(|n| SendJitter::draw(max, 1, (n % 8) as usize, n / 8))
            .collect();
        assert!(draws.iter().all(|d| (0.0..0.040).contains(d)));
        // Uniform: each quarter of the range holds about a quarter of the draws.
        for q in 0..4 {
            let lo = 0.010 * f64::from(q);
            let n = draws
                .iter()
                .filter(|d| (lo..lo + 0.010).contains(*d))
                .count();
            assert!((400..600).contains(&n), "quarter {q} holds {n} of 2000");
        }
    }

    #[test]
    fn a_seed_fixes_each_lanes_sequence_whatever_the_completion_order() {
        let max = Duration::from_millis(50);
        let mut a = SendJitter::new(max, 42);
        let mut b = SendJitter::new(max, 42);
        // Lanes complete interleaved differently in the two runs.
        let a0: Vec<f64> = (0..5).map(|_| a.next(0)).collect();
        let a1: Vec<f64> = (0..5).map(|_| a.next(1)).collect();
        let mut b0 = Vec::new();
        let mut b1 = Vec::new();
        for _ in 0..5 {
            b1.push(b.next(1));
            b0.push(b.next(0));
        }
        assert_eq!(a0, b0);
        assert_eq!(a1, b1);
        assert_ne!(a0, a1, "lanes draw independent sequences");
        let mut c = SendJitter::new(max, 43);
        let c0: Vec<f64> = (0..5).map(|_| c.next(0)).collect();
        assert_ne!(a0, c0, "another seed, another sequence");
    }
}

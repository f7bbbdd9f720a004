//! `target_output_tps` mode (SPEC §4.3): laxity against the per-request rate objective T,
//! and the credit that pays for sacrificing a request.

/// Share of requests allowed below T (internal constant of the objective).
pub const EPSILON: f64 = 0.2;
/// The credit bucket is clamped to ± this many completions' earnings.
pub const CREDIT_CLAMP_COMPLETIONS: f64 = 3000.0;

/// What the laxity of a request depends on, all on the leader's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateState {
    pub first_token_time: f64,
    pub max_tokens: u32,
    pub output_tokens: u32,
    /// Decode seconds since the first token with every pause taken out.
    pub unpaused_decode_s: f64,
}

/// Whether a request has produced enough to measure its own rate: more than its first
/// token, over some unpaused decode time. Its own rate and its own TPOT exist exactly then.
fn measurable(output_tokens: u32, unpaused_decode_s: f64) -> bool {
    output_tokens > 1 && unpaused_decode_s > 0.0
}

/// The request's own unpaused output rate (tokens/s), or `fallback` (R0) while it has
/// produced too little to measure.
pub fn own_rate(r: &RateState, fallback: f64) -> f64 {
    if measurable(r.output_tokens, r.unpaused_decode_s) {
        (r.output_tokens - 1) as f64 / r.unpaused_decode_s
    } else {
        fallback
    }
}

/// The request's own unpaused TPOT (decode seconds per token after the first), while it
/// has produced too little to measure `None`.
pub fn own_tpot(output_tokens: u32, unpaused_decode_s: f64) -> Option<f64> {
    measurable(output_tokens, unpaused_decode_s)
        .then(|| unpaused_decode_s / (output_tokens - 1) as f64)
}

/// The time by which a request must finish to keep T: first token + (max_tokens − 1) / T.
pub fn deadline(first_token_time: f64, max_tokens: u32, target_tps: f64) -> f64 {
    first_token_time + max_tokens.saturating_sub(1) as f64 / target_tps
}

/// Laxity: deadline − projected finish, where the deadline is first token +
/// (max_tokens − 1) / T and the projected finish is now + remaining ÷ own unpaused rate.
/// It is how long the request can still be paused and finish at or above T.
pub fn laxity(r: &RateState, now: f64, target_tps: f64, fallback_rate: f64) -> f64 {
    let deadline = deadline(r.first_token_time, r.max_tokens, target_tps);
    let remaining = r.max_tokens.saturating_sub(r.output_tokens) as f64;
    let rate = own_rate(r, fallback_rate);
    let projected = if rate > 0.0 {
        now + remaining / rate
    } else {
        f64::INFINITY
    };
    deadline - projected
}

/// A value computed cheaply, with a bound on how far the exact computation's value can be
/// from it. Rounding makes each of the few operations behind an estimate off by at most
/// half an ulp of a value no larger than the sum of the magnitudes involved, so 10⁻¹² of
/// that sum bounds the difference with room to spare. A rule that compares can decide on
/// the estimate when it is that far on one side, and compute the exact value otherwise: it
/// then decides exactly as if it had computed every value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub margin: f64,
}

/// Relative size of an estimate's margin.
const ESTIMATE_MARGIN: f64 = 1e-12;

impl Estimate {
    /// Certainly below `x` (false for NaN).
    pub fn below(&self, x: f64) -> bool {
        self.value + self.margin < x
    }
    /// Certainly above `x` (false for NaN).
    pub fn above(&self, x: f64) -> bool {
        self.value - self.margin > x
    }
}

/// deadline − now, with a multiplication by 1/T (`inverse_target`) where `deadline` divides.
pub fn deadline_slack_estimate(
    first_token_time: f64,
    max_tokens: u32,
    inverse_target: f64,
    now: f64,
) -> Estimate {
    let span = max_tokens.saturating_sub(1) as f64 * inverse_target;
    Estimate {
        value: (first_token_time + span) - now,
        margin: ESTIMATE_MARGIN * (first_token_time.abs() + span.abs() + now.abs()),
    }
}

/// The laxity of a request with its own rate, from its deadline slack's estimate and its own
/// TPOT (unpaused decode seconds per token after the first, which the eligibility rule
/// computes anyway): one multiplication where `laxity` divides three times.
pub fn laxity_estimate(slack: Estimate, remaining: u32, own_tpot: f64) -> Estimate {
    let left = remaining as f64 * own_tpot;
    let value = slack.value - left;
    Estimate {
        value,
        margin: slack.margin + ESTIMATE_MARGIN * (slack.value.abs() + left.abs()),
    }
}

/// Whether a finished request kept the objective: (tokens − 1) / decode time ≥ T.
pub fn met_target(output_tokens: u32, decode_s: f64, target_tps: f64) -> bool {
    if output_tokens <= 1 {
        return true;
    }
    decode_s <= 0.0 || (output_tokens - 1) as f64 / decode_s >= target_tps
}

/// The sacrifice credit: +ε per completion, −1 per completion below T (a sacrificed
/// request was debited when sacrificed, and is refunded if it still meets T), clamped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Credit {
    value: f64,
}

impl Credit {
    pub fn value(&self) -> f64 {
        self.value
    }

    fn clamp(&mut self) {
        let bound = CREDIT_CLAMP_COMPLETIONS * EPSILON;
        self.value = self.value.clamp(-bound, bound);
    }

    pub fn can_sacrifice(&self) -> bool {
        self.value >= 1.0
    }

    /// Debit one sacrifice.
    pub fn sacrifice(&mut self) {
        self.value -= 1.0;
        self.clamp();
    }

    /// Account one completion.
    pub fn complete(&mut self, met: bool, sacrificed: bool) {
        self.value += EPSILON;
        match (met, sacrificed) {
            (false, false) => self.value -= 1.0,
            (true, true) => self.value += 1.0,
            _ => {}
        }
        self.clamp();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(output: u32, unpaused: f64) -> RateState {
        RateState {
            first_token_time: 0.0,
            max_tokens: 101,
            output_tokens: output,
            unpaused_decode_s: unpaused,
        }
    }

    #[test]
    fn laxity_without_pauses_is_the_margin_of_the_own_rate_over_t() {
        // 50 tokens in 1 s → rate 49/s; T = 25: deadline 4 s; remaining 51 at 49/s.
        let r = state(50, 1.0);
        let lax = laxity(&r, 1.0, 25.0, 1.0);
        assert!((lax - (4.0 - (1.0 + 51.0 / 49.0))).abs() < 1e-12);
    }

    #[test]
    fn a_pause_spends_laxity_one_for_one() {
        let r = state(50, 1.0);
        let before = laxity(&r, 1.0, 25.0, 1.0);
        // Paused for 0.7 s: unpaused time unchanged, the clock moved.
        let after = laxity(&r, 1.7, 25.0, 1.0);
        assert!((before - after - 0.7).abs() < 1e-12);
    }

    #[test]
    fn without_output_the_fallback_rate_is_used() {
        let r = state(1, 0.0);
        assert_eq!(own_rate(&r, 30.0), 30.0);
    }

    #[test]
    fn credit_earns_epsilon_debits_misses_refunds_sacrifices_and_clamps() {
        let mut c = Credit::default();
        for _ in 0..5 {
            c.complete(true, false);
        }
        assert!((c.value() - 1.0).abs() < 1e-12);
        assert!(c.can_sacrifice());
        c.sacrifice();
        assert!(c.value().abs() < 1e-12);
        c.complete(true, true); // sacrificed but met: refund
        assert!((c.value() - 1.2).abs() < 1e-12);
        c.complete(false, true); // sacrificed and missed: not charged twice
        assert!((c.value() - 1.4).abs() < 1e-12);
        c.complete(false, false);
        assert!((c.value() - 0.6).abs() < 1e-12);
        for _ in 0..10_000 {
            c.complete(true, false);
        }
        assert!((c.value() - 600.0).abs() < 1e-9);
        for _ in 0..10_000 {
            c.complete(false, false);
        }
        assert!((c.value() + 600.0).abs() < 1e-9);
    }

    proptest::proptest! {
        #[test]
        fn the_slack_and_laxity_estimates_are_within_their_margins_of_the_exact_values(
            ft in 0.0f64..1e6,
            since_ft in 0.0f64..1e4,
            max_tokens in 2u32..100_000,
            output in 2u32..100_000,
            unpaused_share in 0.001f64..1.0,
            target in 0.1f64..1000.0,
        ) {
            let output = output.min(max_tokens);
            let r = RateState {
                first_token_time: ft,
                max_tokens,
                output_tokens: output,
                unpaused_decode_s: since_ft * unpaused_share,
            };
            proptest::prop_assume!(r.unpaused_decode_s > 0.0);
            let now = ft + since_ft;
            let d = deadline(ft, max_tokens, target);
            let slack = deadline_slack_estimate(ft, max_tokens, 1.0 / target, now);
            proptest::prop_assert!((slack.value - (d - now)).abs() <= slack.margin);
            let tpot = own_tpot(output, r.unpaused_decode_s).expect("measurable");
            let est = laxity_estimate(slack, max_tokens - output, tpot);
            let exact = laxity(&r, now, target, 1.0);
            proptest::prop_assert!((est.value - exact).abs() <= est.margin, "{est:?} {exact}");
            proptest::prop_assert!(!est.below(exact) && !est.above(exact));
        }
    }

    #[test]
    fn met_target_compares_the_finished_rate_with_t() {
        assert!(met_target(101, 4.0, 25.0));
        assert!(!met_target(101, 4.1, 25.0));
    }
}

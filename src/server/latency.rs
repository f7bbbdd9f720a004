//! Per-request latency as the client sees it (TTFT, TPOT, E2E), recorded by the HTTP layer
//! into the metrics of `crate::metrics`.

use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{counter, histogram};

use crate::metrics as m;

/// Unix seconds now. Wall clock, because `arrival_time` from upstream is wall clock.
pub fn now_unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The timings of one request; every method takes the current time so the arithmetic is
/// testable without a clock.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestClock {
    arrival_unix_s: f64,
    first_token_unix_s: Option<f64>,
    tokens: u64,
}

/// What the clock measured for a finished request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    pub e2e_s: f64,
    /// `None` with fewer than two output tokens.
    pub tpot_s: Option<f64>,
    pub tokens: u64,
}

impl RequestClock {
    pub fn new(arrival_unix_s: f64) -> Self {
        RequestClock {
            arrival_unix_s,
            first_token_unix_s: None,
            tokens: 0,
        }
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// `n` tokens reached the client at `now`; returns the TTFT when these include the first.
    /// An upstream arrival slightly in the future (clock skew) gives a TTFT of 0, not < 0.
    pub fn on_tokens(&mut self, n: u64, now_unix_s: f64) -> Option<f64> {
        if n == 0 {
            return None;
        }
        self.tokens += n;
        if self.first_token_unix_s.is_some() {
            return None;
        }
        self.first_token_unix_s = Some(now_unix_s);
        Some((now_unix_s - self.arrival_unix_s).max(0.0))
    }

    pub fn on_finish(&self, now_unix_s: f64) -> Finished {
        let tpot_s = match self.first_token_unix_s {
            Some(first) if self.tokens >= 2 => {
                Some((now_unix_s - first).max(0.0) / (self.tokens - 1) as f64)
            }
            _ => None,
        };
        Finished {
            e2e_s: (now_unix_s - self.arrival_unix_s).max(0.0),
            tpot_s,
            tokens: self.tokens,
        }
    }
}

/// `RequestClock` plus the metric side effects, used by both response modes.
/// Dropped without `on_finish` or `on_fail`, it counts as cancelled (the client went away).
#[derive(Debug)]
pub struct RecordedRequest {
    clock: RequestClock,
    ended: bool,
}

impl RecordedRequest {
    pub fn start(arrival_unix_s: f64, prompt_tokens: usize) -> Self {
        counter!(m::PROMPT_TOKENS_TOTAL).increment(prompt_tokens as u64);
        RecordedRequest {
            clock: RequestClock::new(arrival_unix_s),
            ended: false,
        }
    }

    pub fn tokens(&self) -> u64 {
        self.clock.tokens()
    }

    pub fn on_tokens(&mut self, n: u64) {
        if let Some(ttft) = self.clock.on_tokens(n, now_unix_s()) {
            histogram!(m::TIME_TO_FIRST_TOKEN_SECONDS).record(ttft);
        }
        counter!(m::GENERATION_TOKENS_TOTAL).increment(n);
    }

    pub fn on_finish(&mut self, finished_reason: &'static str) {
        self.ended = true;
        let done = self.clock.on_finish(now_unix_s());
        histogram!(m::E2E_REQUEST_LATENCY_SECONDS).record(done.e2e_s);
        if let Some(tpot) = done.tpot_s {
            histogram!(m::TIME_PER_OUTPUT_TOKEN_SECONDS).record(tpot);
        }
        counter!(m::REQUEST_SUCCESS_TOTAL, m::LABEL_FINISHED_REASON => finished_reason)
            .increment(1);
    }
}

impl RecordedRequest {
    /// An accepted request ended without a finish reason; `reason` labels the metric
    /// ([`m::FAILED_ENGINE`], [`m::FAILED_TIMEOUT`]).
    pub fn on_fail(&mut self, reason: &'static str) {
        self.ended = true;
        counter!(m::REQUESTS_FAILED_TOTAL, m::LABEL_REASON => reason).increment(1);
    }
}

impl Drop for RecordedRequest {
    fn drop(&mut self) {
        if !self.ended {
            counter!(m::REQUESTS_FAILED_TOTAL, m::LABEL_REASON => m::FAILED_CANCELLED).increment(1);
        }
    }
}

pub fn record_rejection(code: &'static str) {
    counter!(m::REQUESTS_REJECTED_TOTAL, m::LABEL_REASON => code).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttft_is_counted_from_arrival_once() {
        let mut c = RequestClock::new(100.0);
        assert_eq!(c.on_tokens(0, 100.5), None);
        assert_eq!(c.on_tokens(1, 101.25), Some(1.25));
        assert_eq!(c.on_tokens(3, 102.0), None);
        assert_eq!(c.tokens(), 4);
    }

    #[test]
    fn tpot_spreads_decode_time_over_tokens_after_the_first() {
        let mut c = RequestClock::new(10.0);
        c.on_tokens(1, 11.0);
        c.on_tokens(4, 12.0);
        let f = c.on_finish(13.0);
        assert_eq!(f.tokens, 5);
        assert_eq!(f.e2e_s, 3.0);
        assert_eq!(f.tpot_s, Some(0.5));
    }

    #[test]
    fn one_token_has_no_tpot_and_skewed_arrival_never_goes_negative() {
        let mut c = RequestClock::new(50.0);
        assert_eq!(c.on_tokens(1, 49.0), Some(0.0));
        let f = c.on_finish(49.5);
        assert_eq!((f.tpot_s, f.e2e_s), (None, 0.0));
    }
}

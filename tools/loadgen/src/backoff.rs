//! Back-off for closed-loop lanes whose server is down, restarting or shedding load.
//!
//! A closed-loop lane sends its next request when the previous one ends. A refused connection
//! ends in well under a millisecond, so without a back-off every lane would hammer a server
//! that is down or restarting (thousands of attempts a second). So after a request that failed
//! for a reason that says "not now", the lane waits before its next send:
//!
//! - a connection-level failure ([`ErrorKind::Connect`]: refused, reset before the response
//!   head, DNS), a 429, or a server error (5xx: a failing server answers those as fast as a
//!   closed port refuses) without `Retry-After`: the `k`-th such failure in a row waits a
//!   seeded draw from `[d/2, d]`, `d = FLOOR × 2^(k−1)` capped at [`CAP`];
//! - a 429 or 5xx with `Retry-After`: the time the server asked for (at most
//!   [`MAX_RETRY_AFTER`]);
//! - anything else (a completion, a 4xx other than 429, a broken stream, a timeout, a run-end
//!   cancellation): no wait, and the streak starts again.
//!
//! Every attempt is still a measured request and counts as failed. Open-loop arrivals follow
//! their timestamps and never back off. A draw depends only on the seed, the lane and how many
//! back-off draws the lane has made, so a seed fixes the sequence.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::jitter::{mix, unit};
use crate::record::{ErrorKind, RequestError};

/// The first back-off's upper end; the shortest wait is half of it.
pub const FLOOR: Duration = Duration::from_millis(50);
/// The longest back-off drawn (a `Retry-After` may ask for more).
pub const CAP: Duration = Duration::from_secs(2);
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Keeps the back-off stream apart from the other uses of `--seed`.
const STREAM: u64 = 0x6261_636b_6f66_6601;

/// What a failed request asks of its lane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cause {
    /// Nothing: send as usual.
    None,
    /// Wait on the back-off schedule.
    Backoff,
    /// Wait as long as the server asked (seconds).
    RetryAfter(f64),
}

impl Cause {
    /// The cause of a request's outcome (`None` for a completion).
    pub fn of(error: Option<&RequestError>) -> Self {
        let Some(e) = error else {
            return Cause::None;
        };
        match (e.kind, e.status) {
            (ErrorKind::Connect, _) => Cause::Backoff,
            (ErrorKind::Http, Some(429 | 500..=599)) => match e.retry_after_s {
                Some(s) if !s.is_nan() => {
                    Cause::RetryAfter(s.clamp(0.0, MAX_RETRY_AFTER.as_secs_f64()))
                }
                _ => Cause::Backoff,
            },
            _ => Cause::None,
        }
    }
}

/// Per-lane back-off of a run.
#[derive(Debug, Clone)]
pub struct Backoff {
    seed: u64,
    /// Per lane: failures in a row that asked for a wait.
    streak: BTreeMap<usize, u32>,
    /// Per lane: back-off draws so far (the index of the next draw).
    draws: BTreeMap<usize, u64>,
}

impl Backoff {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            streak: BTreeMap::new(),
            draws: BTreeMap::new(),
        }
    }

    /// The upper end `d` of the `k`-th consecutive back-off (1-based): `FLOOR × 2^(k−1)`,
    /// at most [`CAP`].
    pub fn ceiling(k: u32) -> Duration {
        let doublings = k.saturating_sub(1).min(16);
        FLOOR.saturating_mul(1 << doublings).min(CAP)
    }

    /// The `n`-th back-off draw of `lane` for the `k`-th failure in a row, in seconds: uniform
    /// in `[d/2, d]` with `d = ceiling(k)`.
    pub fn draw(seed: u64, lane: usize, n: u64, k: u32) -> f64 {
        let d = Self::ceiling(k).as_secs_f64();
        let u = unit(mix(mix(mix(seed ^ STREAM) ^ lane as u64) ^ n));
        d / 2.0 + u * d / 2.0
    }

    /// How long (seconds) `lane` waits before its next send, after a request that ended with
    /// `error` (`None`: completed).
    pub fn after(&mut self, lane: usize, error: Option<&RequestError>) -> f64 {
        let cause = Cause::of(error);
        if cause == Cause::None {
            self.streak.remove(&lane);
            return 0.0;
        }
        let k = self.streak.entry(lane).or_insert(0);
        *k = k.saturating_add(1);
        match cause {
            Cause::RetryAfter(s) => s,
            _ => {
                let n = self.draws.entry(lane).or_insert(0);
                let wait = Self::draw(self.seed, lane, *n, *k);
                *n += 1;
                wait
            }
        }
    }
}

/// A `Retry-After` value in seconds from now: delay-seconds (`1`) or an HTTP date (a date in
/// the past is 0). `None` when it is neither.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<f64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(secs as f64);
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).map_or(0.0, |d| d.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn err(kind: ErrorKind, status: Option<u16>, retry_after_s: Option<f64>) -> RequestError {
        RequestError {
            kind,
            status,
            message: String::new(),
            retry_after_s,
        }
    }

    #[test]
    fn connection_failures_in_a_row_wait_longer_each_time_up_to_the_cap() {
        let mut b = Backoff::new(7);
        let refused = err(ErrorKind::Connect, None, None);
        let waits: Vec<f64> = (0..12).map(|_| b.after(0, Some(&refused))).collect();
        for (i, w) in waits.iter().enumerate() {
            let d = Backoff::ceiling(i as u32 + 1).as_secs_f64();
            assert!(
                (d / 2.0..=d).contains(w),
                "failure {}: {w} s vs d {d}",
                i + 1
            );
        }
        assert!((0.025..=0.050).contains(&waits[0]));
        assert!(waits.iter().all(|w| *w <= CAP.as_secs_f64()));
        assert!(waits[11] >= CAP.as_secs_f64() / 2.0, "capped, not reset");
        assert_eq!(Backoff::ceiling(1), FLOOR);
        assert_eq!(Backoff::ceiling(2), FLOOR * 2);
        assert_eq!(Backoff::ceiling(u32::MAX), CAP);
    }

    #[test]
    fn a_completion_or_an_ordinary_failure_ends_the_streak_without_a_wait() {
        let mut b = Backoff::new(1);
        let refused = err(ErrorKind::Connect, None, None);
        for _ in 0..6 {
            b.after(3, Some(&refused));
        }
        assert_eq!(b.after(3, None), 0.0);
        let first_again = b.after(3, Some(&refused));
        assert!(first_again <= FLOOR.as_secs_f64(), "{first_again}");
        for other in [
            err(ErrorKind::Http, Some(404), None),
            err(ErrorKind::Http, Some(400), Some(5.0)),
            err(ErrorKind::DroppedStream, None, None),
            err(ErrorKind::StreamError, None, None),
            err(ErrorKind::Timeout, None, None),
            err(ErrorKind::Cancelled, None, None),
        ] {
            assert_eq!(b.after(3, Some(&other)), 0.0, "{other:?}");
        }
    }

    #[test]
    fn a_429_or_a_server_error_waits_what_retry_after_asks_else_backs_off() {
        let mut b = Backoff::new(0);
        for status in [429, 500, 502, 503, 504] {
            let asked = err(ErrorKind::Http, Some(status), Some(1.0));
            assert_eq!(b.after(0, Some(&asked)), 1.0);
            let silent = err(ErrorKind::Http, Some(status), None);
            let w = b.after(1, Some(&silent));
            assert!(
                w >= FLOOR.as_secs_f64() / 2.0 && w <= CAP.as_secs_f64(),
                "{w}"
            );
        }
        let absurd = err(ErrorKind::Http, Some(429), Some(1e30));
        assert_eq!(b.after(2, Some(&absurd)), MAX_RETRY_AFTER.as_secs_f64());
    }

    #[test]
    fn a_seed_fixes_each_lanes_back_off_sequence() {
        let refused = err(ErrorKind::Connect, None, None);
        let seq = |seed, lane| {
            let mut b = Backoff::new(seed);
            (0..5)
                .map(|_| b.after(lane, Some(&refused)))
                .collect::<Vec<_>>()
        };
        assert_eq!(seq(4, 0), seq(4, 0));
        assert_ne!(seq(4, 0), seq(4, 1), "lanes draw apart");
        assert_ne!(seq(4, 0), seq(5, 0), "another seed, another sequence");
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_an_http_date() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("1", now), Some(1.0));
        assert_eq!(parse_retry_after(" 120 ", now), Some(120.0));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(10.0)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:27 GMT", now),
            Some(0.0)
        );
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert!(parse_retry_after("1", SystemTime::now()).is_some());
    }
}

//! Which arrival a request's TTFT counts from (SPEC §7). An upstream stamp (`arrival_time` in
//! the body, or the `x-arrival-time` header) is honoured only when the operator trusts the
//! sender (`server.trust_arrival_time`, for a router that stamps requests), and then only
//! within a horizon: a client must never move itself up the queue or move X by forging it.

use super::error::ApiError;

/// How upstream arrival stamps are treated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArrivalPolicy {
    pub trust: bool,
    /// With `trust`: stamps further than this from the receive time are refused.
    pub horizon_s: f64,
}

impl Default for ArrivalPolicy {
    /// Untrusted: every request arrives when this server receives it.
    fn default() -> Self {
        ArrivalPolicy {
            trust: false,
            horizon_s: 600.0,
        }
    }
}

impl ArrivalPolicy {
    /// The arrival (unix seconds) to use, or `None` for "when received". `body` is the
    /// body's `arrival_time` value, `header` the `x-arrival-time` header; the body wins.
    /// A trusted stamp in the future within the horizon is clock skew and counts as
    /// `received_unix_s`; one outside the horizon is a 400.
    pub fn resolve(
        &self,
        body: Option<&serde_json::Value>,
        header: Option<&str>,
        received_unix_s: f64,
    ) -> Result<Option<f64>, ApiError> {
        if !self.trust {
            return Ok(None);
        }
        let (value, param) = match (body.filter(|v| !v.is_null()), header) {
            (Some(v), _) => (
                v.as_f64().ok_or_else(|| {
                    ApiError::invalid(
                        "invalid_type",
                        Some("arrival_time"),
                        format!("`arrival_time` must be unix seconds, got {v}"),
                    )
                })?,
                "arrival_time",
            ),
            (None, Some(h)) => (
                h.trim().parse::<f64>().map_err(|_| {
                    ApiError::invalid(
                        "invalid_value",
                        Some("x-arrival-time"),
                        format!("the x-arrival-time header must be unix seconds, got {h:?}"),
                    )
                })?,
                "x-arrival-time",
            ),
            (None, None) => return Ok(None),
        };
        if !value.is_finite() || (value - received_unix_s).abs() > self.horizon_s {
            return Err(ApiError::invalid(
                "invalid_value",
                Some(param),
                format!(
                    "`{param}` ({value}) is more than server.arrival_horizon_s ({} s) away from \
                     this server's clock ({received_unix_s:.3})",
                    self.horizon_s
                ),
            ));
        }
        Ok(Some(value.min(received_unix_s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: f64 = 1_700_000_000.0;
    const TRUSTED: ArrivalPolicy = ArrivalPolicy {
        trust: true,
        horizon_s: 60.0,
    };

    #[test]
    fn untrusted_stamps_are_ignored() {
        let p = ArrivalPolicy::default();
        assert_eq!(p.resolve(Some(&json!(1.0)), Some("1"), NOW), Ok(None));
    }

    #[test]
    fn trusted_stamps_come_from_the_body_then_the_header() {
        assert_eq!(
            TRUSTED.resolve(Some(&json!(NOW - 5.0)), Some("0"), NOW),
            Ok(Some(NOW - 5.0))
        );
        assert_eq!(
            TRUSTED.resolve(None, Some(&format!(" {} ", NOW - 2.5)), NOW),
            Ok(Some(NOW - 2.5))
        );
        assert_eq!(TRUSTED.resolve(None, None, NOW), Ok(None));
    }

    #[test]
    fn future_stamps_count_as_now_and_distant_ones_are_refused() {
        assert_eq!(
            TRUSTED.resolve(Some(&json!(NOW + 3.0)), None, NOW),
            Ok(Some(NOW))
        );
        for stamp in [1.0, NOW - 61.0, NOW + 61.0] {
            let e = TRUSTED.resolve(Some(&json!(stamp)), None, NOW).unwrap_err();
            assert_eq!(e.param(), Some("arrival_time"));
        }
        let e = TRUSTED.resolve(None, Some("soon"), NOW).unwrap_err();
        assert_eq!(e.param(), Some("x-arrival-time"));
        let e = TRUSTED.resolve(Some(&json!("x")), None, NOW).unwrap_err();
        assert_eq!(e.code, "invalid_type");
    }
}

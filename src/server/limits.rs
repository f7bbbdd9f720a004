//! The server's limits (`server.*` in the config), in the types the HTTP layer uses.

use std::time::Duration;

use super::arrival::ArrivalPolicy;
use crate::config::ServerConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// A request unfinished this long after it was received fails (504 / an error event).
    pub request_timeout: Duration,
    /// Output bound of a request without `max_tokens`.
    pub default_max_tokens: u32,
    /// At shutdown: how long in-flight requests may still run.
    pub drain_timeout: Duration,
    /// A connection must send a request's header within this; it is also how long a
    /// kept-alive connection may sit idle.
    pub header_read_timeout: Duration,
    /// A request body not whole this long after its header is refused (408).
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    pub max_body_bytes: usize,
    pub arrival: ArrivalPolicy,
}

impl Limits {
    /// From a validated config (every duration finite, positive and bounded).
    pub fn from_config(s: &ServerConfig) -> Self {
        let secs = |v: f64| Duration::try_from_secs_f64(v).unwrap_or(Duration::MAX);
        Limits {
            request_timeout: secs(s.request_timeout_s),
            default_max_tokens: s.default_max_tokens.max(1),
            drain_timeout: secs(s.drain_timeout_s),
            header_read_timeout: secs(s.header_read_timeout_s),
            body_read_timeout: secs(s.body_read_timeout_s),
            max_connections: usize::try_from(s.max_connections)
                .unwrap_or(usize::MAX)
                .max(1),
            max_body_bytes: usize::try_from(s.max_body_bytes).unwrap_or(usize::MAX),
            arrival: ArrivalPolicy {
                trust: s.trust_arrival_time,
                horizon_s: s.arrival_horizon_s,
            },
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::from_config(&ServerConfig::default())
    }
}

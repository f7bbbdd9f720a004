//! The leader's clock: real time in the server, shared virtual time in tests and replays.
//! Every component that waits or timestamps takes an `Arc<dyn Clock>`, so the same code runs
//! on either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The leader's clock, in seconds since it started.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> f64;
    /// Let `seconds` pass: sleep for real, or advance virtual time.
    fn pass(&self, seconds: f64);
}

/// Wall-clock time since construction; `pass` sleeps the thread.
#[derive(Debug, Clone)]
pub struct RealClock {
    start: Instant,
}

impl RealClock {
    pub fn new() -> Self {
        RealClock {
            start: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    fn pass(&self, seconds: f64) {
        if seconds > 0.0 && seconds.is_finite() {
            std::thread::sleep(Duration::from_secs_f64(seconds));
        }
    }
}

/// Shared virtual time: `pass` advances it, nothing sleeps. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct VirtualClock {
    bits: Arc<AtomicU64>,
}

impl VirtualClock {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn set(&self, t: f64) {
        self.bits.store(t.to_bits(), Ordering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::SeqCst))
    }
    fn pass(&self, seconds: f64) {
        if seconds > 0.0 && seconds.is_finite() {
            let _ = self
                .bits
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                    Some((f64::from_bits(b) + seconds).to_bits())
                });
        }
    }
}

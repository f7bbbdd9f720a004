//! The recurrent-state pool: one fixed-size state per resident request, for hybrid models
//! with linear-attention or Mamba-like layers. State `i` lies at bytes
//! `[i·state_bytes, (i+1)·state_bytes)` of the backend's state buffer (device memory on
//! cuda), so a paused request's state stays where it is until its lease is released.

use std::ops::Range;

use super::index::IndexPool;

#[derive(Debug, Clone)]
pub struct RecurrentPool {
    states: IndexPool,
    state_bytes: u64,
}

impl RecurrentPool {
    pub fn new(capacity: u32, headroom: u32, state_bytes: u64) -> Self {
        Self {
            states: IndexPool::new("recurrent_state", capacity, headroom),
            state_bytes,
        }
    }

    /// Device memory for every state, headroom included.
    pub fn bytes(&self) -> u64 {
        recurrent_bytes(self.states.capacity(), self.state_bytes)
    }

    pub fn state_bytes(&self) -> u64 {
        self.state_bytes
    }

    /// Bytes of a request's state in the backend's buffer, while it holds one.
    pub fn range_of(&self, id: crate::ids::RequestId) -> Option<Range<u64>> {
        self.states
            .index_of(id)
            .map(|i| state_range(i, self.state_bytes))
    }
}

/// Bytes of state `index` in a buffer of states of `state_bytes` each.
pub fn state_range(index: u32, state_bytes: u64) -> Range<u64> {
    u64::from(index) * state_bytes..(u64::from(index) + 1) * state_bytes
}

impl std::ops::Deref for RecurrentPool {
    type Target = IndexPool;
    fn deref(&self) -> &IndexPool {
        &self.states
    }
}

impl std::ops::DerefMut for RecurrentPool {
    fn deref_mut(&mut self) -> &mut IndexPool {
        &mut self.states
    }
}

/// Memory estimate of a recurrent pool for `residents` requests (headroom included).
pub fn recurrent_bytes(residents: u32, state_bytes: u64) -> u64 {
    residents as u64 * state_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::PoolError;

    #[test]
    fn states_lie_back_to_back_and_the_estimate_includes_the_headroom() {
        // 8 slots + a paused cap of 3 of 1 KiB states.
        let mut p = RecurrentPool::new(11, 3, 1024);
        assert_eq!(p.bytes(), 11 * 1024);
        assert_eq!(p.usage().headroom, 3);
        let mut seen = Vec::new();
        for id in 0..11 {
            p.acquire(id).unwrap();
            seen.push(p.range_of(id).unwrap());
        }
        assert!(matches!(p.acquire(11), Err(PoolError::Exhausted { .. })));
        seen.sort_by_key(|r| r.start);
        assert_eq!(seen.first().map(|r| r.start), Some(0));
        assert!(seen.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(seen.last().map(|r| r.end), Some(p.bytes()));
        let r5 = p.range_of(5).unwrap();
        p.release(5).unwrap();
        assert_eq!(p.range_of(5), None);
        p.acquire(40).unwrap();
        assert_eq!(p.range_of(40), Some(r5), "the lowest free state is reused");
    }
}

//! The recurrent-state pool: one fixed-size state per resident request, for hybrid models
//! with linear-attention or Mamba-like layers.

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

//! The recurrent-state pool: one fixed-size state per resident request, for hybrid models
//! with linear-attention or Mamba-like layers.

use std::collections::{BTreeMap, BTreeSet};

use super::{PoolError, PoolReport, PoolUsage};
use crate::policy::RequestId;

const NAME: &str = "recurrent_state";

#[derive(Debug, Clone)]
pub struct RecurrentPool {
    capacity: u32,
    headroom: u32,
    state_bytes: u64,
    free: BTreeSet<u32>,
    held: BTreeMap<RequestId, u32>,
}

impl RecurrentPool {
    pub fn new(capacity: u32, headroom: u32, state_bytes: u64) -> Self {
        Self {
            capacity,
            headroom,
            state_bytes,
            free: (0..capacity).collect(),
            held: BTreeMap::new(),
        }
    }

    pub fn acquire(&mut self, id: RequestId) -> Result<u32, PoolError> {
        if self.held.contains_key(&id) {
            return Err(PoolError::AlreadyHeld { pool: NAME, id });
        }
        let s = self.free.pop_first().ok_or(PoolError::Exhausted {
            pool: NAME,
            capacity: self.capacity as u64,
        })?;
        self.held.insert(id, s);
        Ok(s)
    }

    pub fn release(&mut self, id: RequestId) -> Result<u32, PoolError> {
        let s = self
            .held
            .remove(&id)
            .ok_or(PoolError::NotHeld { pool: NAME, id })?;
        self.free.insert(s);
        Ok(s)
    }

    pub fn available(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.held.len() as u32
    }

    /// Device memory for every state, headroom included.
    pub fn bytes(&self) -> u64 {
        self.capacity as u64 * self.state_bytes
    }

    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            pool: NAME,
            capacity: self.capacity as u64,
            used: self.used() as u64,
            headroom: self.headroom as u64,
        }
    }

    pub fn report(&self) -> PoolReport {
        PoolReport {
            pool: NAME,
            resident_capacity: self.capacity as u64,
        }
    }
}

/// Memory estimate of a recurrent pool for `residents` requests (headroom included).
pub fn recurrent_bytes(residents: u32, state_bytes: u64) -> u64 {
    residents as u64 * state_bytes
}

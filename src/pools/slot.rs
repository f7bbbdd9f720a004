//! The sequence-slot pool: batch-row indices for resident requests.

use std::collections::{BTreeMap, BTreeSet};

use super::{PoolError, PoolReport, PoolUsage};
use crate::policy::RequestId;

const NAME: &str = "sequence_slots";

#[derive(Debug, Clone)]
pub struct SlotPool {
    capacity: u32,
    headroom: u32,
    free: BTreeSet<u32>,
    held: BTreeMap<RequestId, u32>,
}

impl SlotPool {
    /// `capacity` slots, of which `headroom` are the paused cap's reservation.
    pub fn new(capacity: u32, headroom: u32) -> Self {
        Self {
            capacity,
            headroom,
            free: (0..capacity).collect(),
            held: BTreeMap::new(),
        }
    }

    /// The lowest free slot, so decisions never depend on release order timing.
    pub fn acquire(&mut self, id: RequestId) -> Result<u32, PoolError> {
        if self.held.contains_key(&id) {
            return Err(PoolError::AlreadyHeld { pool: NAME, id });
        }
        let slot = self.free.pop_first().ok_or(PoolError::Exhausted {
            pool: NAME,
            capacity: self.capacity as u64,
        })?;
        self.held.insert(id, slot);
        Ok(slot)
    }

    pub fn release(&mut self, id: RequestId) -> Result<u32, PoolError> {
        let slot = self
            .held
            .remove(&id)
            .ok_or(PoolError::NotHeld { pool: NAME, id })?;
        self.free.insert(slot);
        Ok(slot)
    }

    pub fn slot_of(&self, id: RequestId) -> Option<u32> {
        self.held.get(&id).copied()
    }

    pub fn available(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.held.len() as u32
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

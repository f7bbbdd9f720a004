//! A pool of numbered entries, one per request, lowest index first: the shape shared by the
//! sequence-slot pool and the recurrent-state pool.

use std::collections::{BTreeMap, BTreeSet};

use super::{PoolError, PoolReport, PoolUsage};
use crate::ids::RequestId;

#[derive(Debug, Clone)]
pub struct IndexPool {
    name: &'static str,
    capacity: u32,
    headroom: u32,
    free: BTreeSet<u32>,
    held: BTreeMap<RequestId, u32>,
}

impl IndexPool {
    /// `capacity` entries, of which `headroom` are the paused cap's reservation.
    pub fn new(name: &'static str, capacity: u32, headroom: u32) -> Self {
        Self {
            name,
            capacity,
            headroom,
            free: (0..capacity).collect(),
            held: BTreeMap::new(),
        }
    }

    /// The lowest free index, so decisions never depend on release-order timing.
    pub fn acquire(&mut self, id: RequestId) -> Result<u32, PoolError> {
        if self.held.contains_key(&id) {
            return Err(PoolError::AlreadyHeld {
                pool: self.name,
                id,
            });
        }
        let i = self.free.pop_first().ok_or(PoolError::Exhausted {
            pool: self.name,
            capacity: self.capacity as u64,
        })?;
        self.held.insert(id, i);
        Ok(i)
    }

    pub fn release(&mut self, id: RequestId) -> Result<u32, PoolError> {
        let i = self.held.remove(&id).ok_or(PoolError::NotHeld {
            pool: self.name,
            id,
        })?;
        self.free.insert(i);
        Ok(i)
    }

    pub fn index_of(&self, id: RequestId) -> Option<u32> {
        self.held.get(&id).copied()
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn available(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.held.len() as u32
    }

    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            pool: self.name,
            capacity: self.capacity as u64,
            used: self.used() as u64,
            headroom: self.headroom as u64,
        }
    }

    pub fn report(&self) -> PoolReport {
        PoolReport {
            pool: self.name,
            resident_capacity: self.capacity as u64,
        }
    }
}

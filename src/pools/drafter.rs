//! The drafter arena: per-request slots of speculative-decoding state (a rolling window of
//! recent tokens standing in for draft KV), plus scratch slots the drafter uses per step.
//! Slots of paused and displaced requests are retained, not recycled; a slot is released
//! only when its request finishes. Request, scratch and free ranges never overlap.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::{PoolError, PoolReport, PoolUsage};
use crate::policy::RequestId;

const NAME: &str = "drafter";

#[derive(Debug, Clone)]
struct Slot {
    index: u32,
    window: VecDeque<u32>,
}

#[derive(Debug, Clone)]
pub struct DrafterArena {
    request_slots: u32,
    scratch_slots: u32,
    window_tokens: u32,
    headroom: u32,
    free: BTreeSet<u32>,
    held: BTreeMap<RequestId, Slot>,
    retained: BTreeSet<RequestId>,
}

impl DrafterArena {
    /// `request_slots` per-request slots (headroom included) followed by `scratch_slots`.
    pub fn new(request_slots: u32, scratch_slots: u32, window_tokens: u32, headroom: u32) -> Self {
        Self {
            request_slots,
            scratch_slots,
            window_tokens,
            headroom,
            free: (0..request_slots).collect(),
            held: BTreeMap::new(),
            retained: BTreeSet::new(),
        }
    }

    pub fn acquire(&mut self, id: RequestId) -> Result<u32, PoolError> {
        if self.held.contains_key(&id) {
            return Err(PoolError::AlreadyHeld { pool: NAME, id });
        }
        let index = self.free.pop_first().ok_or(PoolError::Exhausted {
            pool: NAME,
            capacity: self.request_slots as u64,
        })?;
        self.held.insert(
            id,
            Slot {
                index,
                window: VecDeque::new(),
            },
        );
        Ok(index)
    }

    /// Keep the slot of a request that is out of the batch (paused or displaced).
    pub fn retain(&mut self, id: RequestId) -> Result<(), PoolError> {
        if !self.held.contains_key(&id) {
            return Err(PoolError::NotHeld { pool: NAME, id });
        }
        self.retained.insert(id);
        Ok(())
    }

    /// The request is back in the batch.
    pub fn unretain(&mut self, id: RequestId) {
        self.retained.remove(&id);
    }

    pub fn is_retained(&self, id: RequestId) -> bool {
        self.retained.contains(&id)
    }

    /// Append emitted tokens to the request's rolling window.
    pub fn push_tokens(&mut self, id: RequestId, tokens: &[u32]) -> Result<(), PoolError> {
        let cap = self.window_tokens as usize;
        let slot = self
            .held
            .get_mut(&id)
            .ok_or(PoolError::NotHeld { pool: NAME, id })?;
        for &t in tokens {
            if cap == 0 {
                break;
            }
            if slot.window.len() == cap {
                slot.window.pop_front();
            }
            slot.window.push_back(t);
        }
        Ok(())
    }

    pub fn window_of(&self, id: RequestId) -> Option<Vec<u32>> {
        self.held
            .get(&id)
            .map(|s| s.window.iter().copied().collect())
    }

    pub fn slot_of(&self, id: RequestId) -> Option<u32> {
        self.held.get(&id).map(|s| s.index)
    }

    pub fn release(&mut self, id: RequestId) -> Result<u32, PoolError> {
        let slot = self
            .held
            .remove(&id)
            .ok_or(PoolError::NotHeld { pool: NAME, id })?;
        self.retained.remove(&id);
        self.free.insert(slot.index);
        Ok(slot.index)
    }

    pub fn available(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.held.len() as u32
    }

    /// Token ranges [start, end) of a request slot and of the scratch area.
    pub fn request_range(&self, index: u32) -> (u64, u64) {
        let w = self.window_tokens as u64;
        (index as u64 * w, (index as u64 + 1) * w)
    }

    pub fn scratch_range(&self) -> (u64, u64) {
        let w = self.window_tokens as u64;
        (
            self.request_slots as u64 * w,
            (self.request_slots + self.scratch_slots) as u64 * w,
        )
    }

    /// Held and free slots partition the request area; no range overlaps scratch.
    pub fn check_invariants(&self) -> Result<(), String> {
        let held: BTreeSet<u32> = self.held.values().map(|s| s.index).collect();
        if held.len() != self.held.len() {
            return Err("two requests share a drafter slot".into());
        }
        if let Some(x) = held.intersection(&self.free).next() {
            return Err(format!("slot {x} is both held and free"));
        }
        if held.len() + self.free.len() != self.request_slots as usize {
            return Err("drafter slots leaked".into());
        }
        let scratch = self.scratch_range();
        for &i in held.iter().chain(self.free.iter()) {
            let (s, e) = self.request_range(i);
            if i >= self.request_slots || (s < scratch.1 && e > scratch.0 && e > s) {
                return Err(format!("slot {i} overlaps scratch"));
            }
        }
        if self.retained.iter().any(|id| !self.held.contains_key(id)) {
            return Err("a retained request holds no slot".into());
        }
        Ok(())
    }

    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            pool: NAME,
            capacity: self.request_slots as u64,
            used: self.used() as u64,
            headroom: self.headroom as u64,
        }
    }

    pub fn report(&self) -> PoolReport {
        PoolReport {
            pool: NAME,
            resident_capacity: self.request_slots as u64,
        }
    }
}

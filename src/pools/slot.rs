//! The sequence-slot pool: batch-row indices for resident requests.

use super::index::IndexPool;

/// Sequence slots; every call is [`IndexPool`]'s.
pub type SlotPool = IndexPool;

/// A slot pool of `capacity` slots, `headroom` of them reserved for paused requests.
pub fn slot_pool(capacity: u32, headroom: u32) -> SlotPool {
    IndexPool::new("sequence_slots", capacity, headroom)
}

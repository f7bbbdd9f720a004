//! The drafter arena: per-request slots of speculative-decoding state (the rolling window of
//! recent tokens the prompt-lookup drafter searches), plus scratch rows the drafter uses per
//! step. Slots of paused and displaced requests are retained, not recycled; a slot is
//! released only when its request finishes. Request, scratch and free ranges never overlap.
//!
//! [`DrafterLayout`] maps slots to offsets in one flat buffer of 32-bit words: the step
//! backend keeps the windows there (device memory on cuda, host memory on the CPU
//! reference), at the offsets of the slots this arena hands out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;

use super::{PoolError, PoolReport, PoolUsage};
use crate::ids::RequestId;

const NAME: &str = "drafter";

#[derive(Debug, Clone)]
struct Slot {
    index: u32,
    window: VecDeque<u32>,
}

/// Where the arena's slots lie in one flat buffer of `u32` words. Request slot `i` is
/// `[i·stride, (i+1)·stride)`, then scratch row `j` follows every request slot; stride =
/// [`Self::HEADER_WORDS`] + window. A request slot holds the count of tokens pushed so far,
/// then a ring of `window` tokens (token `p` of the sequence at `1 + p % window`). A scratch
/// row holds one batch row's draft: its length, then the draft tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrafterLayout {
    pub request_slots: u32,
    pub scratch_slots: u32,
    pub window: u32,
}

/// Which part of the arena buffer a word belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaPart {
    Request(u32),
    Scratch(u32),
}

impl DrafterLayout {
    /// Words before the ring of a request slot (the pushed-token count).
    pub const HEADER_WORDS: u64 = 1;

    pub fn new(request_slots: u32, scratch_slots: u32, window: u32) -> Self {
        Self {
            request_slots,
            scratch_slots,
            window,
        }
    }

    /// Words per slot, request or scratch.
    pub fn stride(&self) -> u64 {
        Self::HEADER_WORDS + u64::from(self.window)
    }

    /// Words of request slot `slot`.
    pub fn request_range(&self, slot: u32) -> Range<u64> {
        let s = self.stride();
        u64::from(slot) * s..(u64::from(slot) + 1) * s
    }

    /// Words of scratch row `row` (one per batch row).
    pub fn scratch_range(&self, row: u32) -> Range<u64> {
        let s = self.stride();
        let at = u64::from(self.request_slots) + u64::from(row);
        at * s..(at + 1) * s
    }

    /// Every scratch row together.
    pub fn scratch_area(&self) -> Range<u64> {
        let s = self.stride();
        u64::from(self.request_slots) * s..self.total_words()
    }

    pub fn total_words(&self) -> u64 {
        (u64::from(self.request_slots) + u64::from(self.scratch_slots)) * self.stride()
    }

    /// Bytes of the whole buffer (what the backend allocates).
    pub fn bytes(&self) -> u64 {
        self.total_words() * 4
    }

    /// The slot or scratch row that word `w` belongs to (`None` past the end).
    pub fn part_of(&self, w: u64) -> Option<ArenaPart> {
        if w >= self.total_words() {
            return None;
        }
        let i = w / self.stride();
        Some(if i < u64::from(self.request_slots) {
            ArenaPart::Request(i as u32)
        } else {
            ArenaPart::Scratch((i - u64::from(self.request_slots)) as u32)
        })
    }
}

/// Memory estimate of a drafter arena for `residents` requests (headroom included) and
/// `scratch` batch rows, each slot keeping `window` tokens.
pub fn drafter_bytes(residents: u32, scratch: u32, window: u32) -> u64 {
    DrafterLayout::new(residents, scratch, window).bytes()
}

#[derive(Debug, Clone)]
pub struct DrafterArena {
    layout: DrafterLayout,
    headroom: u32,
    free: BTreeSet<u32>,
    held: BTreeMap<RequestId, Slot>,
    retained: BTreeSet<RequestId>,
}

impl DrafterArena {
    /// `request_slots` per-request slots (headroom included) followed by `scratch_slots`.
    pub fn new(request_slots: u32, scratch_slots: u32, window_tokens: u32, headroom: u32) -> Self {
        Self {
            layout: DrafterLayout::new(request_slots, scratch_slots, window_tokens),
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
            capacity: u64::from(self.layout.request_slots),
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
        let cap = self.layout.window as usize;
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

    /// Where the slots lie in the backend's buffer.
    pub fn layout(&self) -> DrafterLayout {
        self.layout
    }

    /// Words of a request's slot in the backend's buffer, while it holds one.
    pub fn range_of(&self, id: RequestId) -> Option<Range<u64>> {
        self.slot_of(id).map(|i| self.layout.request_range(i))
    }

    /// Held and free slots partition the request area; the words of no two slots overlap,
    /// and none overlaps the scratch area.
    pub fn check_invariants(&self) -> Result<(), String> {
        let held: BTreeSet<u32> = self.held.values().map(|s| s.index).collect();
        if held.len() != self.held.len() {
            return Err("two requests share a drafter slot".into());
        }
        if let Some(x) = held.intersection(&self.free).next() {
            return Err(format!("slot {x} is both held and free"));
        }
        if held.len() + self.free.len() != self.layout.request_slots as usize {
            return Err("drafter slots leaked".into());
        }
        let scratch = self.layout.scratch_area();
        let mut end = 0;
        // Every slot in address order: each must start at or after the end of the one before.
        let mut all: Vec<u32> = held.iter().chain(self.free.iter()).copied().collect();
        all.sort_unstable();
        for i in all {
            let r = self.layout.request_range(i);
            if i >= self.layout.request_slots || (r.start < scratch.end && scratch.start < r.end) {
                return Err(format!("slot {i} overlaps scratch"));
            }
            if r.start < end {
                return Err(format!("slot {i} overlaps the slot before it"));
            }
            end = r.end;
        }
        if self.retained.iter().any(|id| !self.held.contains_key(id)) {
            return Err("a retained request holds no slot".into());
        }
        Ok(())
    }

    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            pool: NAME,
            capacity: u64::from(self.layout.request_slots),
            used: self.used() as u64,
            headroom: self.headroom as u64,
        }
    }

    pub fn report(&self) -> PoolReport {
        PoolReport {
            pool: NAME,
            resident_capacity: u64::from(self.layout.request_slots),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slots_map_to_disjoint_word_ranges_before_the_scratch_rows() {
        let l = DrafterLayout::new(3, 2, 8);
        assert_eq!(l.stride(), 9);
        assert_eq!(l.request_range(0), 0..9);
        assert_eq!(l.request_range(2), 18..27);
        assert_eq!(l.scratch_range(0), 27..36);
        assert_eq!(l.scratch_area(), 27..45);
        assert_eq!(l.bytes(), 45 * 4);
        assert_eq!(l.part_of(26), Some(ArenaPart::Request(2)));
        assert_eq!(l.part_of(27), Some(ArenaPart::Scratch(0)));
        assert_eq!(l.part_of(45), None);
    }

    #[test]
    fn a_retained_slot_keeps_its_range_and_window_until_release_frees_it() {
        let mut a = DrafterArena::new(4, 2, 4, 1);
        let s7 = a.acquire(7).unwrap();
        let s9 = a.acquire(9).unwrap();
        a.push_tokens(7, &[1, 2, 3, 4, 5]).unwrap();
        let range = a.range_of(7).unwrap();
        a.retain(7).unwrap();
        // Another request comes and goes while 7 is paused: it never gets 7's slot.
        let s11 = a.acquire(11).unwrap();
        assert!(![s7, s9].contains(&s11));
        a.release(11).unwrap();
        assert!(a.is_retained(7));
        assert_eq!(a.range_of(7), Some(range));
        assert_eq!(a.window_of(7), Some(vec![2, 3, 4, 5]));
        a.unretain(7);
        assert_eq!(a.release(7), Ok(s7));
        assert_eq!(a.range_of(7), None);
        assert!(!a.is_retained(7));
        assert!(matches!(a.release(7), Err(PoolError::NotHeld { .. })));
        a.check_invariants().unwrap();
    }

    #[test]
    fn the_arena_is_sized_for_the_paused_cap_and_refuses_past_it() {
        // 8 slots and a paused cap of 3: 11 residents hold a slot each, the 12th does not.
        let cap = crate::policy::preemption::paused_cap(8);
        assert_eq!(cap, 3);
        let mut a = DrafterArena::new(8 + cap, 8, 16, cap);
        for id in 0..11 {
            a.acquire(id).unwrap();
        }
        assert!(matches!(
            a.acquire(11),
            Err(PoolError::Exhausted { capacity: 11, .. })
        ));
        let u = a.usage();
        assert_eq!((u.capacity, u.used, u.headroom), (11, 11, 3));
        assert_eq!(drafter_bytes(11, 8, 16), (11 + 8) * 17 * 4);
        assert_eq!(a.layout().bytes(), drafter_bytes(11, 8, 16));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u64),
        Retain(u64),
        Unretain(u64),
        Release(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let id = 0u64..12;
        prop_oneof![
            id.clone().prop_map(Op::Acquire),
            id.clone().prop_map(Op::Retain),
            id.clone().prop_map(Op::Unretain),
            id.prop_map(Op::Release),
        ]
    }

    proptest! {
        /// Every word of the buffer belongs to exactly one slot or scratch row, and the
        /// mapping goes both ways.
        #[test]
        fn slot_and_offset_map_both_ways_and_cover_the_buffer_once(
            slots in 1u32..40, scratch in 0u32..20, window in 1u32..70,
        ) {
            let l = DrafterLayout::new(slots, scratch, window);
            let mut next = 0;
            for i in 0..slots {
                let r = l.request_range(i);
                prop_assert_eq!(r.start, next);
                prop_assert_eq!(r.end - r.start, l.stride());
                prop_assert_eq!(l.part_of(r.start), Some(ArenaPart::Request(i)));
                prop_assert_eq!(l.part_of(r.end - 1), Some(ArenaPart::Request(i)));
                next = r.end;
            }
            prop_assert_eq!(l.scratch_area().start, next);
            for j in 0..scratch {
                let r = l.scratch_range(j);
                prop_assert_eq!(r.start, next);
                prop_assert_eq!(l.part_of(r.start), Some(ArenaPart::Scratch(j)));
                next = r.end;
            }
            prop_assert_eq!(next, l.total_words());
            prop_assert_eq!(l.part_of(next), None);
        }

        /// Over random acquire / retain / unretain / release sequences: no two held
        /// requests share a slot or overlap, held and free slots partition the request
        /// area, a retained request keeps its slot and window until released, and a
        /// released slot is free again.
        #[test]
        fn arena_invariants_hold_over_random_lease_histories(
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut a = DrafterArena::new(6, 3, 5, 2);
            let mut model: BTreeMap<u64, u32> = BTreeMap::new();
            let mut pinned: BTreeMap<u64, (u32, Option<Vec<u32>>)> = BTreeMap::new();
            for (k, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Acquire(id) => match a.acquire(id) {
                        Ok(s) => {
                            prop_assert!(!model.values().any(|&x| x == s), "slot {} reused", s);
                            model.insert(id, s);
                            a.push_tokens(id, &[k as u32, id as u32]).unwrap();
                        }
                        Err(_) => prop_assert!(model.contains_key(&id) || model.len() == 6),
                    },
                    Op::Retain(id) => {
                        if a.retain(id).is_ok() {
                            pinned.insert(id, (model[&id], a.window_of(id)));
                        } else {
                            prop_assert!(!model.contains_key(&id));
                        }
                    }
                    Op::Unretain(id) => {
                        a.unretain(id);
                        pinned.remove(&id);
                    }
                    Op::Release(id) => {
                        let r = a.release(id);
                        prop_assert_eq!(r.ok(), model.remove(&id));
                        pinned.remove(&id);
                    }
                }
                prop_assert!(a.check_invariants().is_ok(), "{:?}", a.check_invariants());
                prop_assert_eq!(a.used() as usize, model.len());
                for (&id, (slot, window)) in &pinned {
                    prop_assert!(a.is_retained(id));
                    prop_assert_eq!(a.slot_of(id), Some(*slot));
                    prop_assert_eq!(&a.window_of(id), window);
                }
            }
        }
    }
}

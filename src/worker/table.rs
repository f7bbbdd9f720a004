//! The resident table: records in a slab indexed by sequence slot (dense, bounded by the
//! slot pool), with an id index in id order. Per-row work in a pass goes through the slot,
//! so it costs no search.

use std::collections::BTreeMap;

use super::Res;
use crate::policy::RequestId;

#[derive(Debug, Clone, Default)]
pub(super) struct ResidentTable {
    slab: Vec<Option<Res>>,
    index: BTreeMap<RequestId, u32>,
}

impl ResidentTable {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn contains_key(&self, id: &RequestId) -> bool {
        self.index.contains_key(id)
    }

    pub fn get_mut(&mut self, id: &RequestId) -> Option<&mut Res> {
        let slot = *self.index.get(id)?;
        self.by_slot_mut(slot, *id)
    }

    /// The record in `slot`, if it belongs to `id`.
    pub fn by_slot_mut(&mut self, slot: u32, id: RequestId) -> Option<&mut Res> {
        self.slab
            .get_mut(slot as usize)?
            .as_mut()
            .filter(|r| r.id == id)
    }

    pub fn insert(&mut self, r: Res) {
        let slot = r.slot as usize;
        if self.slab.len() <= slot {
            self.slab.resize_with(slot + 1, || None);
        }
        self.index.insert(r.id, r.slot);
        self.slab[slot] = Some(r);
    }

    pub fn remove(&mut self, id: &RequestId) -> Option<Res> {
        let slot = self.index.remove(id)?;
        self.slab.get_mut(slot as usize)?.take()
    }

    /// Records in id order.
    pub fn values(&self) -> impl Iterator<Item = &Res> {
        self.index
            .values()
            .filter_map(|&s| self.slab.get(s as usize).and_then(Option::as_ref))
    }
}

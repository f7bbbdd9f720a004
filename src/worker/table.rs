//! The resident table: records in a slab indexed by sequence slot (dense, bounded by the
//! slot pool), an id index in id order (the preemption controller's order) and the
//! admission order (the batch's order). Per-row work in a pass goes through the slot, so it
//! costs no search; both orders are kept as rows come and go, so a pass neither walks a
//! tree nor sorts.

use std::cmp::Ordering;

use super::Res;
use crate::policy::preemption::AdmitRow;
use crate::policy::RequestId;

#[derive(Debug, Clone, Default)]
pub(super) struct ResidentTable {
    slab: Vec<Option<Res>>,
    /// (id, slot), in id order.
    index: Vec<(RequestId, u32)>,
    /// Oldest admission first; ties by id, as the batch and the controller order them.
    by_admit: Vec<AdmitRow>,
}

fn admit_order(a: &AdmitRow, admit_time: f64, id: RequestId) -> Ordering {
    a.admit_time.total_cmp(&admit_time).then(a.id.cmp(&id))
}

impl ResidentTable {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    fn find(&self, id: RequestId) -> Result<usize, usize> {
        self.index.binary_search_by_key(&id, |e| e.0)
    }

    pub fn contains_key(&self, id: &RequestId) -> bool {
        self.find(*id).is_ok()
    }

    pub fn get(&self, id: &RequestId) -> Option<&Res> {
        let slot = self.index[self.find(*id).ok()?].1;
        self.at(slot, *id)
    }

    pub fn get_mut(&mut self, id: &RequestId) -> Option<&mut Res> {
        let slot = self.index[self.find(*id).ok()?].1;
        self.by_slot_mut(slot, *id)
    }

    /// The record in `slot`, if it belongs to `id`.
    pub fn by_slot_mut(&mut self, slot: u32, id: RequestId) -> Option<&mut Res> {
        self.slab
            .get_mut(slot as usize)?
            .as_mut()
            .filter(|r| r.id == id)
    }

    /// Insert a request not yet resident (its slot lease guarantees that).
    pub fn insert(&mut self, r: Res) {
        let slot = r.slot as usize;
        if self.slab.len() <= slot {
            self.slab.resize_with(slot + 1, || None);
        }
        match self.find(r.id) {
            Ok(i) => self.index[i].1 = r.slot,
            Err(i) => self.index.insert(i, (r.id, r.slot)),
        }
        // Admission times only grow, so this is almost always the end.
        let at = self
            .by_admit
            .partition_point(|e| admit_order(e, r.admit_time, r.id) == Ordering::Less);
        self.by_admit.insert(
            at,
            AdmitRow {
                admit_time: r.admit_time,
                id: r.id,
                slot: r.slot,
            },
        );
        self.slab[slot] = Some(r);
    }

    pub fn remove(&mut self, id: &RequestId) -> Option<Res> {
        let i = self.find(*id).ok()?;
        let (_, slot) = self.index.remove(i);
        let r = self.slab.get_mut(slot as usize)?.take()?;
        if let Ok(at) = self
            .by_admit
            .binary_search_by(|e| admit_order(e, r.admit_time, r.id))
        {
            self.by_admit.remove(at);
        }
        Some(r)
    }

    fn at(&self, slot: u32, id: RequestId) -> Option<&Res> {
        self.slab
            .get(slot as usize)
            .and_then(Option::as_ref)
            .filter(|r| r.id == id)
    }

    /// Records in id order.
    pub fn values(&self) -> impl Iterator<Item = &Res> {
        self.index.iter().filter_map(|&(id, s)| self.at(s, id))
    }

    /// Records oldest admission first (ties by id).
    pub fn by_admission(&self) -> impl Iterator<Item = &Res> {
        self.by_admit.iter().filter_map(|a| self.at(a.slot, a.id))
    }

    /// Residents oldest admission first (ties by id), as rows.
    pub fn admission_order(&self) -> &[AdmitRow] {
        &self.by_admit
    }
}

//! The resident table: the controller's rows (`Resident`, in id order, handed to the step
//! as they are, never copied) with the worker's own part of each record alongside, and
//! the admission order (the batch's order) as places in those rows, four bytes each: the
//! batch walk reads every one each pass, and an entry that carried its admission time and
//! id too made the pass's data outgrow the L1 cache by that much more. Per-row work in a pass
//! goes through a place, so it costs no search. Rows mostly join at the end (ids grow) and
//! leave in one compaction per pass, which renumbers the admission order as it goes.
//!
//! The rows live at the end of their buffers, after a gap the table leaves at the front: a
//! single row that leaves closes its hole from the nearer end, so when it is among the
//! oldest (as most finished requests are) only the rows below it move, one place up, and
//! the gap grows by one. Every place is counted from the first live row, so it is the same
//! place either way. The gap is given back once it is `GAP_LIMIT` rows long.

use std::cmp::Ordering;

use super::Res;
use crate::ids::RequestId;
use crate::policy::preemption::{admission_order, Resident};

/// Rows of gap at the front before the buffers are compacted (one move of every row).
const GAP_LIMIT: usize = 64;

#[derive(Debug, Clone, Default)]
pub(super) struct ResidentTable {
    /// The controller's rows, in id order, from `start` on.
    row_buf: Vec<Resident>,
    /// The worker's part of each row, aligned with `row_buf`.
    res_buf: Vec<Res>,
    /// The first live row of both buffers (the gap before it is free).
    start: usize,
    /// Places in `rows`, oldest admission first (ties by id, as the batch and the
    /// controller order them).
    by_admit: Vec<u32>,
    /// Places removed by the last `remove_sorted`, ascending (reused).
    gone: Vec<u32>,
    /// Each old place's new place during a `remove_sorted` of several rows (reused).
    moved: Vec<u32>,
}

/// One resident's record: the controller's row and the worker's part.
pub(super) struct RowMut<'a> {
    pub v: &'a mut Resident,
    pub x: &'a mut Res,
}

/// Where `key`'s row goes in (or is found in) `by_admit`.
fn admit_position(by_admit: &[u32], rows: &[Resident], key: &Resident) -> usize {
    by_admit.partition_point(|&p| {
        rows.get(p as usize)
            .is_some_and(|r| admission_order(r, key) == Ordering::Less)
    })
}

impl ResidentTable {
    pub fn len(&self) -> usize {
        self.row_buf.len() - self.start
    }

    /// The controller's rows, in id order.
    pub fn rows(&self) -> &[Resident] {
        &self.row_buf[self.start..]
    }

    /// The worker's part of each row, aligned with `rows`.
    pub fn res(&self) -> &[Res] {
        &self.res_buf[self.start..]
    }

    /// The controller's rows, to change in place; never their ids, which keep the order.
    pub fn rows_mut(&mut self) -> &mut [Resident] {
        &mut self.row_buf[self.start..]
    }

    fn find(&self, id: RequestId) -> Result<usize, usize> {
        self.rows().binary_search_by_key(&id, |r| r.id)
    }

    pub fn contains_key(&self, id: &RequestId) -> bool {
        self.find(*id).is_ok()
    }

    pub fn get(&self, id: &RequestId) -> Option<(&Resident, &Res)> {
        let i = self.find(*id).ok()?;
        Some((&self.rows()[i], &self.res()[i]))
    }

    pub fn get_mut(&mut self, id: &RequestId) -> Option<RowMut<'_>> {
        let i = self.start + self.find(*id).ok()?;
        Some(RowMut {
            v: &mut self.row_buf[i],
            x: &mut self.res_buf[i],
        })
    }

    /// The place of `id`'s record.
    pub fn place(&self, id: RequestId) -> Option<u32> {
        self.find(id).ok().map(|i| i as u32)
    }

    /// The record at `place`, if it belongs to `id`.
    pub fn at_mut(&mut self, place: u32, id: RequestId) -> Option<RowMut<'_>> {
        let i = self.start + place as usize;
        let v = self.row_buf.get_mut(i).filter(|r| r.id == id)?;
        Some(RowMut {
            v,
            x: &mut self.res_buf[i],
        })
    }

    /// The record at `place` (one from `admission_order`).
    pub fn at(&self, place: u32) -> (&Resident, &Res) {
        (&self.rows()[place as usize], &self.res()[place as usize])
    }

    /// Insert a request not yet resident (its slot lease guarantees that); its place.
    pub fn insert(&mut self, v: Resident, x: Res) -> u32 {
        if self.contains_key(&v.id) {
            self.remove_sorted(&[v.id], |_, _| {});
        }
        let i = self.find(v.id).unwrap_or_else(|i| i);
        // Admission times only grow, so this is almost always the end. Found before the
        // places move, while each still names its row.
        let at = admit_position(&self.by_admit, self.rows(), &v);
        // Ids mostly grow, so the row is almost always the last and nothing moves.
        if i < self.len() {
            for p in &mut self.by_admit {
                *p += u32::from(*p as usize >= i);
            }
        }
        self.by_admit.insert(at, i as u32);
        self.row_buf.insert(self.start + i, v);
        self.res_buf.insert(self.start + i, x);
        i as u32
    }

    /// Remove the residents among `ids` (sorted, deduplicated), handing each removed
    /// record to `removed` in id order. One compaction of the rows and of the admission
    /// order, whatever the number removed.
    pub fn remove_sorted(&mut self, ids: &[RequestId], mut removed: impl FnMut(&Resident, &Res)) {
        self.gone.clear();
        let mut from = 0;
        for &id in ids {
            if let Ok(i) = self.rows()[from..].binary_search_by_key(&id, |r| r.id) {
                let i = from + i;
                removed(&self.rows()[i], &self.res()[i]);
                self.gone.push(i as u32);
                from = i + 1;
            }
        }
        let Some(&first) = self.gone.first() else {
            return;
        };
        // The usual pass has one departure: its admission-order entry, found by its key.
        let single = match self.gone[..] {
            [g] => {
                let r = &self.rows()[g as usize];
                let k = admit_position(&self.by_admit, self.rows(), r);
                let found = self.by_admit.get(k) == Some(&g);
                found.then_some((g, k))
            }
            _ => None,
        };
        let len = self.len();
        match single {
            // One row leaves from the lower half: the rows below it move up one and the
            // gap grows; every place above it is one less, as when the rows above move down.
            Some((g, _)) if (g as usize) < len / 2 => {
                let (s, g) = (self.start, g as usize);
                self.row_buf.copy_within(s..s + g, s + 1);
                self.res_buf.copy_within(s..s + g, s + 1);
                self.start += 1;
            }
            // The kept runs between removed places move down, run by run. (Callgrind counts
            // a `memmove` per byte, so a row-by-row loop looks cheaper there; sampled time
            // says the two are even.)
            _ => {
                let (gone, s) = (&self.gone, self.start);
                let mut w = s + first as usize;
                for (k, &g) in gone.iter().enumerate() {
                    let end = s + gone.get(k + 1).map_or(len, |&n| n as usize);
                    let from = s + g as usize + 1;
                    self.row_buf.copy_within(from..end, w);
                    self.res_buf.copy_within(from..end, w);
                    w += end - from;
                }
                self.row_buf.truncate(w);
                self.res_buf.truncate(w);
            }
        }
        if self.start >= GAP_LIMIT {
            self.row_buf.drain(..self.start);
            self.res_buf.drain(..self.start);
            self.start = 0;
        }
        if let Some((g, k)) = single {
            // Its entry leaves, and every place above it moves down one, a subtraction
            // without a branch per entry.
            self.by_admit.remove(k);
            for p in &mut self.by_admit {
                *p -= u32::from(*p > g);
            }
        } else {
            // Several departures (or one whose entry is not where its key says, which keeping
            // the order rules out): every old place's new one (`u32::MAX` for a removed row),
            // made in one sweep, so each entry is renumbered by a lookup, not a search.
            // Filled run by run between the removed places (each run is its places less the
            // removals before it), which the compiler turns into wide stores; a push per place
            // wrote the vector's length back to memory at every place.
            let moved = &mut self.moved;
            moved.clear();
            moved.resize(len, u32::MAX);
            let mut run = 0;
            for (shift, &g) in self.gone.iter().chain(&[len as u32]).enumerate() {
                let end = g as usize;
                for (to, place) in moved[run..end].iter_mut().zip(run as u32..) {
                    *to = place - shift as u32;
                }
                run = end + 1;
            }
            self.by_admit
                .retain_mut(|place| match moved.get(*place as usize).copied() {
                    Some(to) if to != u32::MAX => {
                        *place = to;
                        true
                    }
                    _ => false,
                });
        }
    }

    /// Records in id order.
    pub fn values(&self) -> impl Iterator<Item = (&Resident, &Res)> {
        self.rows().iter().zip(self.res())
    }

    /// The residents' places, oldest admission first (ties by id).
    pub fn admission_order(&self) -> &[u32] {
        &self.by_admit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ids: &[RequestId]) -> ResidentTable {
        let mut t = ResidentTable::default();
        for &id in ids {
            let row = Resident {
                id,
                arrival: 0.0,
                // Later ids admitted earlier: admission order differs from id order.
                admit_time: 100.0 - (id % 5) as f64,
                first_token_time: None,
                output_tokens: 0,
                decode_iters: 0,
                max_tokens: 10,
            };
            let res = Res::new(id as u32, id as u32, 0, false);
            t.insert(row, res);
        }
        t
    }

    #[test]
    fn removing_rows_keeps_id_order_and_every_admission_place_on_its_own_row() {
        let all: Vec<RequestId> = (1..=12).collect();
        for gone in [
            vec![1],
            vec![12],
            vec![5],
            vec![2, 3],
            vec![1, 6, 12],
            vec![4, 7, 8, 11],
            all.clone(),
        ] {
            let mut t = table(&all);
            let mut removed = Vec::new();
            t.remove_sorted(&gone, |r, x| removed.push((r.id, x.slot)));
            assert_eq!(
                removed,
                gone.iter().map(|&id| (id, id as u32)).collect::<Vec<_>>()
            );
            let kept: Vec<RequestId> = all
                .iter()
                .copied()
                .filter(|id| !gone.contains(id))
                .collect();
            let ids: Vec<RequestId> = t
                .values()
                .map(|(r, x)| {
                    assert_eq!(x.slot as RequestId, r.id, "worker part moved with its row");
                    r.id
                })
                .collect();
            assert_eq!(ids, kept);
            let order = t.admission_order();
            assert_eq!(order.len(), kept.len());
            let mut places = order.to_vec();
            places.sort_unstable();
            assert!(
                places.iter().copied().eq(0..kept.len() as u32),
                "every place once, removed {gone:?}"
            );
            for w in order.windows(2) {
                let (a, b) = (t.at(w[0]).0, t.at(w[1]).0);
                assert!(admission_order(a, b).is_lt(), "removed {gone:?}");
            }
        }
    }

    #[test]
    fn rows_leaving_one_at_a_time_from_either_end_keep_every_place_through_the_gap_compaction() {
        let all: Vec<RequestId> = (1..=200).collect();
        let mut t = table(&all);
        let mut kept = all.clone();
        // Oldest first (the gap grows past its limit twice), then from the top, then middles.
        let mut leaving: Vec<RequestId> = (1..=140).collect();
        leaving.extend([200, 199, 170, 150, 160]);
        for id in leaving {
            t.remove_sorted(&[id], |_, _| {});
            kept.retain(|&k| k != id);
            let ids: Vec<RequestId> = t.values().map(|(r, _)| r.id).collect();
            assert_eq!(ids, kept, "after {id} left");
            for (r, x) in t.values() {
                assert_eq!(x.slot as RequestId, r.id, "worker part moved with its row");
            }
            let mut expected: Vec<(f64, RequestId)> =
                kept.iter().map(|&k| (100.0 - (k % 5) as f64, k)).collect();
            expected.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let order: Vec<(f64, RequestId)> = t
                .admission_order()
                .iter()
                .map(|&p| (t.at(p).0.admit_time, t.at(p).0.id))
                .collect();
            assert_eq!(order, expected, "after {id} left");
        }
        // A row joining after the gap closed lands in id order too.
        let row = Resident {
            id: 145,
            arrival: 0.0,
            admit_time: 200.0,
            first_token_time: None,
            output_tokens: 0,
            decode_iters: 0,
            max_tokens: 10,
        };
        let place = t.insert(row, Res::new(145, 145, 0, false));
        assert_eq!(t.at(place).0.id, 145);
        assert!(t.rows().windows(2).all(|w| w[0].id < w[1].id));
    }
}

//! The KV pool: pages of `tokens_per_block` tokens and a page-table (index) pool with one
//! row per resident request. Pausing frees a slot, not pages: a paused request keeps its
//! pages and there is no eviction at all, since a GEN worker cannot recompute a context.
//! When decode growth cannot get a page, `grow` fails and the request waits. Pages are
//! counted when taken and numbered when the request's page table is first read, in chunks
//! (`pages.rs`): the pass's admissions and growth only count, and a backend that reads page
//! tables numbers the new pages in the same walk that copies the table.

use std::collections::BTreeSet;

use serde::Serialize;

use super::budget::KvBudget;
use super::pages::{PageList, PageStore};
use super::{PoolError, PoolReport, PoolUsage};
use crate::ids::RequestId;

const PAGES: &str = "kv_pages";
const ROWS: &str = "kv_index";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvConfig {
    pub tokens_per_block: u32,
    pub total_pages: u32,
    /// Page-table rows: one per resident request.
    pub index_rows: u32,
    /// Sliding-window layers reserve ceil(window / page) pages per resident request.
    pub sliding_window: Option<u32>,
    /// Rows that are the paused cap's reservation (0 with preemption off).
    pub headroom_rows: u32,
}

impl KvConfig {
    pub fn pages_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.tokens_per_block.max(1))
    }

    /// Pages each resident reserves for its sliding-window layers.
    pub fn swa_pages_per_resident(&self) -> u32 {
        self.sliding_window.map_or(0, |w| self.pages_for(w))
    }

    /// How many residents the pool can hold: bounded by rows and by every resident
    /// having at least its SWA reservation (or one page).
    pub fn resident_capacity(&self) -> u64 {
        let per = self.swa_pages_per_resident().max(1) as u64;
        (self.index_rows as u64).min(self.total_pages as u64 / per)
    }
}

/// Memory estimate: every page, plus one page-table row of `max_pages_per_row` u32 entries
/// per resident row (rows include the paused-cap headroom).
pub fn kv_bytes(cfg: &KvConfig, bytes_per_token: u64, max_pages_per_row: u64) -> u64 {
    cfg.total_pages as u64 * cfg.tokens_per_block as u64 * bytes_per_token
        + cfg.index_rows as u64 * max_pages_per_row * 4
}

#[derive(Debug, Clone)]
struct Lease {
    row: u32,
    pages: PageList,
    swa: PageList,
}

/// The leases by page-table row, found by id through a compact sorted index: a pass's decode
/// growth looks up a few ids among a few hundred, and the index's few kilobytes stay in
/// cache where a B-tree keeping each lease beside its key missed on every node.
#[derive(Debug, Clone, Default)]
struct Held {
    /// (id, row), in id order.
    ids: Vec<(RequestId, u32)>,
    by_row: Vec<Option<Lease>>,
}

impl Held {
    fn find(&self, id: RequestId) -> Result<usize, usize> {
        self.ids.binary_search_by_key(&id, |e| e.0)
    }
    fn len(&self) -> usize {
        self.ids.len()
    }
    fn contains_key(&self, id: &RequestId) -> bool {
        self.find(*id).is_ok()
    }
    fn get(&self, id: &RequestId) -> Option<&Lease> {
        let row = self.ids[self.find(*id).ok()?].1;
        self.by_row.get(row as usize)?.as_ref()
    }
    fn get_mut(&mut self, id: &RequestId) -> Option<&mut Lease> {
        let row = self.ids[self.find(*id).ok()?].1;
        self.by_row.get_mut(row as usize)?.as_mut()
    }
    /// `id` must not be held (the pool checks first).
    fn insert(&mut self, id: RequestId, lease: Lease) {
        let (Err(at), row) = (self.find(id), lease.row as usize) else {
            return;
        };
        self.ids.insert(at, (id, lease.row));
        if self.by_row.len() <= row {
            self.by_row.resize(row + 1, None);
        }
        self.by_row[row] = Some(lease);
    }
    fn remove(&mut self, id: &RequestId) -> Option<Lease> {
        let (_, row) = self.ids.remove(self.find(*id).ok()?);
        self.by_row.get_mut(row as usize)?.take()
    }
    /// The leases in row order.
    fn values(&self) -> impl Iterator<Item = &Lease> + Clone {
        self.by_row.iter().flatten()
    }
}

#[derive(Debug, Clone)]
pub struct KvPool {
    cfg: KvConfig,
    pages: PageStore,
    free_rows: BTreeSet<u32>,
    held: Held,
}

impl KvPool {
    pub fn new(cfg: KvConfig) -> Self {
        Self {
            cfg,
            pages: PageStore::new(cfg.total_pages),
            free_rows: (0..cfg.index_rows).collect(),
            held: Held::default(),
        }
    }

    pub fn config(&self) -> &KvConfig {
        &self.cfg
    }

    /// This pool's part of the admission budget.
    pub fn budget(&self) -> KvBudget {
        KvBudget {
            rows: self.free_rows.len() as u32,
            pages: u64::from(self.free_pages()),
            ..KvBudget::empty(&self.cfg)
        }
    }

    /// Whether a context of `tokens` could be admitted now.
    pub fn can_admit(&self, tokens: u32) -> bool {
        self.budget().fits(tokens)
    }

    /// Take a row and the pages for a context of `tokens` (plus the SWA reservation);
    /// answers the row and the context's page count.
    pub fn admit(&mut self, id: RequestId, tokens: u32) -> Result<(u32, u32), PoolError> {
        if self.held.contains_key(&id) {
            return Err(PoolError::AlreadyHeld { pool: ROWS, id });
        }
        // The page rule is the budget's, so `can_admit` and `admit` never disagree.
        let budget = self.budget();
        let total = budget.admit_pages(tokens);
        if budget.pages < total {
            return Err(PoolError::Exhausted {
                pool: PAGES,
                capacity: self.cfg.total_pages as u64,
            });
        }
        let row = self.free_rows.pop_first().ok_or(PoolError::Exhausted {
            pool: ROWS,
            capacity: self.cfg.index_rows as u64,
        })?;
        let swa = budget.swa_pages;
        // At most the free pages, which a u32 counts.
        let context = (total - u64::from(swa)) as u32;
        let mut lease = Lease {
            row,
            pages: PageList::default(),
            swa: PageList::default(),
        };
        self.pages.take(&mut lease.pages, context);
        self.pages.take(&mut lease.swa, swa);
        self.held.insert(id, lease);
        Ok((row, context))
    }

    /// Make room for `tokens` in the request's cache. `Ok(false)` when it already fits;
    /// an error when no page is free (the request must wait; nothing is evicted).
    pub fn grow(&mut self, id: RequestId, tokens: u32) -> Result<bool, PoolError> {
        let before = self.page_count(id);
        let after = self.grow_pages(id, tokens)?;
        Ok(before.is_some_and(|b| after > b))
    }

    /// `grow`, answering the request's page count after it (one lookup, for the pass).
    pub fn grow_pages(&mut self, id: RequestId, tokens: u32) -> Result<u32, PoolError> {
        let need = self.cfg.pages_for(tokens);
        let free = self.free_pages();
        let lease = self
            .held
            .get_mut(&id)
            .ok_or(PoolError::NotHeld { pool: PAGES, id })?;
        let have = lease.pages.len();
        if have >= need {
            return Ok(have);
        }
        if free < need - have {
            return Err(PoolError::Exhausted {
                pool: PAGES,
                capacity: self.cfg.total_pages as u64,
            });
        }
        self.pages.take(&mut lease.pages, need - have);
        Ok(need)
    }

    pub fn release(&mut self, id: RequestId) -> Result<(), PoolError> {
        let lease = self
            .held
            .remove(&id)
            .ok_or(PoolError::NotHeld { pool: ROWS, id })?;
        self.free_rows.insert(lease.row);
        self.pages.give_back(lease.pages);
        self.pages.give_back(lease.swa);
        Ok(())
    }

    /// The request's context pages, in order (its page table); pages taken since the last
    /// read are numbered now.
    pub fn pages_of(&mut self, id: RequestId) -> Option<Vec<u32>> {
        let lease = self.held.get_mut(&id)?;
        self.pages.bind(&mut lease.pages);
        Some(self.pages.pages(&lease.pages).collect())
    }

    /// How many context pages the request holds.
    pub fn page_count(&self, id: RequestId) -> Option<u32> {
        self.held.get(&id).map(|l| l.pages.len())
    }

    pub fn holds(&self, id: RequestId) -> bool {
        self.held.contains_key(&id)
    }

    pub fn free_pages(&self) -> u32 {
        self.pages.free()
    }

    pub fn used_pages(&self) -> u32 {
        self.cfg.total_pages - self.free_pages()
    }

    pub fn used_rows(&self) -> u32 {
        self.held.len() as u32
    }

    pub fn usage(&self) -> [PoolUsage; 2] {
        [
            PoolUsage {
                pool: PAGES,
                capacity: self.cfg.total_pages as u64,
                used: self.used_pages() as u64,
                headroom: self.cfg.headroom_rows as u64 * self.cfg.swa_pages_per_resident() as u64,
            },
            PoolUsage {
                pool: ROWS,
                capacity: self.cfg.index_rows as u64,
                used: self.used_rows() as u64,
                headroom: self.cfg.headroom_rows as u64,
            },
        ]
    }

    pub fn report(&self) -> PoolReport {
        PoolReport {
            pool: "kv",
            resident_capacity: self.cfg.resident_capacity(),
        }
    }

    /// Every page is free or held by exactly one request, and rows likewise.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pages
            .check(self.held.values().flat_map(|l| [&l.pages, &l.swa]))?;
        let rows: BTreeSet<u32> = self.held.values().map(|l| l.row).collect();
        if self.held.ids.iter().any(|&(_, row)| !rows.contains(&row)) {
            return Err("an id names a row without a lease".into());
        }
        if rows.len() != self.held.len() || rows.iter().any(|r| self.free_rows.contains(r)) {
            return Err("a row is shared".into());
        }
        if rows.len() + self.free_rows.len() != self.cfg.index_rows as usize {
            return Err("rows leaked".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pages: u32, rows: u32) -> KvConfig {
        KvConfig {
            tokens_per_block: 32,
            total_pages: pages,
            index_rows: rows,
            sliding_window: None,
            headroom_rows: 0,
        }
    }

    #[test]
    fn admit_takes_pages_for_the_context_and_release_returns_them() {
        let mut kv = KvPool::new(cfg(10, 4));
        kv.admit(1, 65).unwrap();
        assert_eq!(kv.page_count(1), Some(3));
        assert_eq!(kv.free_pages(), 7);
        kv.release(1).unwrap();
        assert_eq!(kv.free_pages(), 10);
        assert_eq!(
            kv.release(1),
            Err(PoolError::NotHeld {
                pool: "kv_index",
                id: 1
            })
        );
        kv.check_invariants().unwrap();
    }

    #[test]
    fn decode_growth_without_a_free_page_fails_and_evicts_nothing() {
        let mut kv = KvPool::new(cfg(2, 4));
        kv.admit(1, 32).unwrap();
        kv.admit(2, 32).unwrap();
        assert!(kv.grow(1, 33).is_err());
        assert_eq!(kv.page_count(2), Some(1));
        assert_eq!(kv.page_count(1), Some(1));
        kv.release(2).unwrap();
        assert_eq!(kv.grow(1, 33), Ok(true));
        kv.check_invariants().unwrap();
    }

    #[test]
    fn sliding_window_reserves_pages_per_resident_and_bounds_capacity() {
        let c = KvConfig {
            sliding_window: Some(100),
            ..cfg(40, 20)
        };
        assert_eq!(c.swa_pages_per_resident(), 4);
        assert_eq!(c.resident_capacity(), 10);
        let mut kv = KvPool::new(c);
        kv.admit(1, 32).unwrap();
        assert_eq!(kv.free_pages(), 35);
        kv.release(1).unwrap();
        kv.check_invariants().unwrap();
    }

    #[test]
    fn kv_bytes_include_headroom_rows() {
        let a = cfg(100, 128);
        let b = KvConfig {
            index_rows: 176,
            headroom_rows: 48,
            ..a
        };
        assert!(kv_bytes(&b, 1000, 64) > kv_bytes(&a, 1000, 64));
        assert_eq!(kv_bytes(&a, 1000, 64), 100 * 32 * 1000 + 128 * 64 * 4);
    }
}

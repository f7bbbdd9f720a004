//! The KV pool: pages of `tokens_per_block` tokens and a page-table (index) pool with one
//! row per resident request. Pausing frees a slot, not pages: a paused request keeps its
//! pages and there is no eviction at all, since a GEN worker cannot recompute a context.
//! When decode growth cannot get a page, `grow` fails and the request waits.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::budget::KvBudget;
use super::{PoolError, PoolReport, PoolUsage};
use crate::policy::RequestId;

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
    pages: Vec<u32>,
    swa: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct KvPool {
    cfg: KvConfig,
    /// Released pages, reused last-in first-out.
    released: Vec<u32>,
    /// Pages at or above this were never handed out, so memory stays O(pages in use).
    fresh: u32,
    free_rows: BTreeSet<u32>,
    held: BTreeMap<RequestId, Lease>,
}

/// Page-table room an admission reserves beyond its context (and a quarter of it), so
/// decode growth rarely reallocates the table.
const GROWTH_PAGES: usize = 32;

/// Append `n` pages to `into`: released ones first, most recently released first, then
/// fresh ones in order (in bulk: a long context takes thousands of pages).
fn take_pages(released: &mut Vec<u32>, fresh: &mut u32, n: usize, into: &mut Vec<u32>) {
    let reused = n.min(released.len());
    let from = released.len() - reused;
    into.reserve(n);
    into.extend(released[from..].iter().rev());
    released.truncate(from);
    let new = (n - reused) as u32;
    into.extend(*fresh..*fresh + new);
    *fresh += new;
}

impl KvPool {
    pub fn new(cfg: KvConfig) -> Self {
        Self {
            cfg,
            released: Vec::new(),
            fresh: 0,
            free_rows: (0..cfg.index_rows).collect(),
            held: BTreeMap::new(),
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

    /// A free page: a released one if any, else the next never-used one. Callers check
    /// `free_pages()` first.
    fn take_pages(&mut self, n: usize, into: &mut Vec<u32>) {
        take_pages(&mut self.released, &mut self.fresh, n, into);
    }

    /// Take a row and the pages for a context of `tokens` (plus the SWA reservation).
    pub fn admit(&mut self, id: RequestId, tokens: u32) -> Result<u32, PoolError> {
        if self.held.contains_key(&id) {
            return Err(PoolError::AlreadyHeld { pool: ROWS, id });
        }
        // The page rule is the budget's, so `can_admit` and `admit` never disagree.
        let budget = self.budget();
        let total = budget.admit_pages(tokens) as usize;
        if (budget.pages as usize) < total {
            return Err(PoolError::Exhausted {
                pool: PAGES,
                capacity: self.cfg.total_pages as u64,
            });
        }
        let row = self.free_rows.pop_first().ok_or(PoolError::Exhausted {
            pool: ROWS,
            capacity: self.cfg.index_rows as u64,
        })?;
        let swa = budget.swa_pages as usize;
        let need = total - swa;
        // Room to decode into: without it the first growth copies the whole page table.
        let mut pages = Vec::with_capacity(need + need / 4 + GROWTH_PAGES);
        let mut swa_pages = Vec::new();
        self.take_pages(need, &mut pages);
        self.take_pages(swa, &mut swa_pages);
        self.held.insert(
            id,
            Lease {
                row,
                pages,
                swa: swa_pages,
            },
        );
        Ok(row)
    }

    /// Make room for `tokens` in the request's cache. `Ok(false)` when it already fits;
    /// an error when no page is free (the request must wait; nothing is evicted).
    pub fn grow(&mut self, id: RequestId, tokens: u32) -> Result<bool, PoolError> {
        let before = self.pages_of(id).map(<[u32]>::len);
        let after = self.grow_pages(id, tokens)?;
        Ok(before.is_some_and(|b| after as usize > b))
    }

    /// `grow`, answering the request's page count after it (one lookup, for the pass).
    pub fn grow_pages(&mut self, id: RequestId, tokens: u32) -> Result<u32, PoolError> {
        let need = self.cfg.pages_for(tokens) as usize;
        let free = self.free_pages() as usize;
        let lease = self
            .held
            .get_mut(&id)
            .ok_or(PoolError::NotHeld { pool: PAGES, id })?;
        let have = lease.pages.len();
        if have >= need {
            return Ok(have as u32);
        }
        if free < need - have {
            return Err(PoolError::Exhausted {
                pool: PAGES,
                capacity: self.cfg.total_pages as u64,
            });
        }
        take_pages(
            &mut self.released,
            &mut self.fresh,
            need - have,
            &mut lease.pages,
        );
        Ok(need as u32)
    }

    pub fn release(&mut self, id: RequestId) -> Result<(), PoolError> {
        let lease = self
            .held
            .remove(&id)
            .ok_or(PoolError::NotHeld { pool: ROWS, id })?;
        self.free_rows.insert(lease.row);
        self.released.extend(lease.pages.into_iter().rev());
        self.released.extend(lease.swa.into_iter().rev());
        Ok(())
    }

    pub fn pages_of(&self, id: RequestId) -> Option<&[u32]> {
        self.held.get(&id).map(|l| l.pages.as_slice())
    }

    pub fn holds(&self, id: RequestId) -> bool {
        self.held.contains_key(&id)
    }

    pub fn free_pages(&self) -> u32 {
        self.released.len() as u32 + (self.cfg.total_pages - self.fresh)
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
        // Pages handed out at least once are either held by exactly one request or released;
        // the rest were never used.
        let mut seen = BTreeSet::new();
        let held = self
            .held
            .values()
            .flat_map(|l| l.pages.iter().chain(l.swa.iter()))
            .copied();
        for p in self.released.iter().copied().chain(held) {
            if p >= self.fresh || !seen.insert(p) {
                return Err(format!("page {p} appears twice or was never handed out"));
            }
        }
        if seen.len() != self.fresh as usize {
            return Err(format!(
                "{} pages accounted of {} handed out",
                seen.len(),
                self.fresh
            ));
        }
        let rows: BTreeSet<u32> = self.held.values().map(|l| l.row).collect();
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
        assert_eq!(kv.pages_of(1).unwrap().len(), 3);
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
        assert_eq!(kv.pages_of(2).unwrap().len(), 1);
        assert_eq!(kv.pages_of(1).unwrap().len(), 1);
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

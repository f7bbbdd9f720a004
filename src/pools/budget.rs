//! Room for new residents across every pool, as data: each pool reports its part, and the
//! admission queue takes from the whole waiter by waiter, in its own order. One admission
//! fits only if every pool has room for it, so a budget is the conjunction of its parts.

use serde::Serialize;

use super::kv::KvConfig;

/// The KV pool's part: free page-table rows and free pages, with the page rule of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvBudget {
    pub rows: u32,
    pub pages: u64,
    pub tokens_per_block: u32,
    /// Pages each resident reserves for its sliding-window layers.
    pub swa_pages: u32,
}

impl KvBudget {
    /// A budget with nothing free, under `cfg`'s page rule.
    pub fn empty(cfg: &KvConfig) -> Self {
        Self {
            rows: 0,
            pages: 0,
            tokens_per_block: cfg.tokens_per_block,
            swa_pages: cfg.swa_pages_per_resident(),
        }
    }

    /// Pages an admission of a `tokens`-token context takes: its context (at least one
    /// page) plus the SWA reservation. `KvPool::admit` takes exactly this many.
    pub fn admit_pages(&self, tokens: u32) -> u64 {
        u64::from(tokens.max(1).div_ceil(self.tokens_per_block.max(1))) + u64::from(self.swa_pages)
    }

    pub fn fits(&self, tokens: u32) -> bool {
        self.rows > 0 && self.pages >= self.admit_pages(tokens)
    }
}

/// Room for admissions now. `None` parts are pools the worker does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AdmitBudget {
    pub slots: u32,
    pub kv: KvBudget,
    pub recurrent: Option<u32>,
    pub drafter: Option<u32>,
}

impl AdmitBudget {
    /// Nothing can be admitted (the budget of a pass with no free active slot).
    pub fn empty(kv: &KvConfig) -> Self {
        Self {
            slots: 0,
            kv: KvBudget::empty(kv),
            recurrent: None,
            drafter: None,
        }
    }

    /// Whether a context of `tokens` fits in every pool.
    pub fn fits(&self, tokens: u32) -> bool {
        self.slots > 0
            && self.kv.fits(tokens)
            && self.recurrent.is_none_or(|n| n > 0)
            && self.drafter.is_none_or(|n| n > 0)
    }

    /// Take one admission of `tokens` if it fits everywhere; otherwise take nothing.
    pub fn try_take(&mut self, tokens: u32) -> bool {
        if !self.fits(tokens) {
            return false;
        }
        self.slots -= 1;
        self.kv.rows -= 1;
        self.kv.pages -= self.kv.admit_pages(tokens);
        for n in [&mut self.recurrent, &mut self.drafter]
            .into_iter()
            .flatten()
        {
            *n -= 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(rows: u32, pages: u64, swa_pages: u32) -> KvBudget {
        KvBudget {
            rows,
            pages,
            tokens_per_block: 32,
            swa_pages,
        }
    }

    fn budget(slots: u32, kv: KvBudget) -> AdmitBudget {
        AdmitBudget {
            slots,
            kv,
            recurrent: None,
            drafter: None,
        }
    }

    #[test]
    fn an_admission_takes_one_entry_of_every_pool_and_its_pages() {
        let mut b = AdmitBudget {
            recurrent: Some(3),
            drafter: Some(2),
            ..budget(4, kv(5, 100, 2))
        };
        assert!(b.try_take(65));
        assert_eq!(
            b,
            AdmitBudget {
                recurrent: Some(2),
                drafter: Some(1),
                ..budget(3, kv(4, 100 - 3 - 2, 2))
            }
        );
    }

    #[test]
    fn the_scarcest_pool_decides_and_a_refusal_takes_nothing() {
        let mut b = AdmitBudget {
            drafter: Some(1),
            ..budget(4, kv(5, 100, 0))
        };
        assert!(b.try_take(1));
        let before = b;
        assert!(!b.try_take(1), "the drafter arena is full");
        assert_eq!(b, before);
        let mut pages = budget(4, kv(5, 2, 0));
        assert!(!pages.try_take(65), "65 tokens need 3 pages");
        assert!(pages.try_take(64));
    }

    #[test]
    fn an_empty_context_still_takes_a_page() {
        assert_eq!(kv(1, 1, 0).admit_pages(0), 1);
        assert!(!kv(1, 0, 0).fits(0));
    }
}

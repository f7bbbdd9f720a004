//! The KV rule of a pause (an addition to SPEC §4.3, docs/results.md §7): a pause admits the
//! head while its victim keeps every page, so it adds a resident's KV to the pool's load. A
//! GEN worker cannot recompute context: when decode growth finds no page the row waits, and
//! when every resident waits for a page none finishes and none frees one. Measured on an
//! 80 GB card's KV, pauses under the other rules alone filled the pool with residents that
//! all needed to grow, and the worker stopped for good (2 of 8 seeds at c288).
//!
//! So a pause also needs the pool to hold what every resident and the head may still write:
//! each request's context and `max_tokens`, in pages. While anything is paused new requests
//! are not admitted (paused requests resume first), so from such a pause until the last
//! paused request resumes the residents' pages-to-finish fit the pool, and every one of them
//! can finish: preemption never holds pages the others need. Past that it is the control's
//! sizing, as without preemption.

/// The pages the pool can promise, counted by the worker for a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRoom {
    /// Pages every resident (active, paused or displaced) needs to finish: its context and
    /// `max_tokens`.
    pub committed_pages: u64,
    /// The same for the queue's head (`None`: no head).
    pub head_pages: Option<u64>,
    pub total_pages: u64,
}

impl KvRoom {
    /// A pool that never binds (tests and callers without KV accounting).
    pub const UNBOUNDED: KvRoom = KvRoom {
        committed_pages: 0,
        head_pages: Some(0),
        total_pages: u64::MAX,
    };

    /// Whether a pause that admits the head leaves every resident able to finish.
    pub fn fits_head(&self) -> bool {
        self.head_pages
            .is_some_and(|h| self.committed_pages.saturating_add(h) <= self.total_pages)
    }
}

impl Default for KvRoom {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_fits_when_every_residents_pages_to_finish_and_its_own_fit_the_pool() {
        let room = |committed, head| KvRoom {
            committed_pages: committed,
            head_pages: head,
            total_pages: 100,
        };
        assert!(room(60, Some(40)).fits_head(), "exactly full");
        assert!(!room(61, Some(40)).fits_head(), "one page short");
        assert!(!room(0, None).fits_head(), "no head, nothing to admit");
        assert!(KvRoom::UNBOUNDED.fits_head());
        assert!(
            !room(u64::MAX, Some(1)).fits_head(),
            "a sum past u64 does not wrap"
        );
    }
}

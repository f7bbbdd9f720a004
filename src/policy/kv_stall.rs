//! A GEN worker's KV pool never stops it (an addition to SPEC §4.5, docs/results.md §7.1).
//!
//! Admission takes pages for a request's context alone; its output's pages come as it
//! decodes, and a row whose growth finds no page waits (§4.5). Nothing bounds that wait: on
//! a pool too small for what its residents go on to write, every row can end up waiting, and
//! then none steps, none finishes and none frees a page. Measured on a pool of 2,048 tokens
//! a slot (llama-8b, 128 slots), the control arm stopped for good within 30 s in every seed,
//! and served on the H100 39 s into the run. Two rules keep the worker live:
//!
//! 1. **Growth first.** While rows wait for a page, the queue admits nobody: an admission
//!    would take the pages a resident needs to finish and free its own. A pause still
//!    admits its head, because the KV rule of a pause (`preemption::kv_room`) lets one
//!    through only when every resident and the head can finish in the pool.
//! 2. **A stalled pass aborts the newest admission.** When no row steps because every row
//!    that could waits for a page (and no admitted context is still arriving), only a
//!    departure can free a page. The resident admitted last leaves with an error that names
//!    the pool, one a stalled pass, until a row steps again. The newest has done the least
//!    work; an engine that can recompute context picks it too, to recompute it later, which a
//!    GEN worker cannot.

use crate::ids::RequestId;

/// Rule 1: whether the queue admits nobody this pass. `waited_last_pass`: the rows that
/// waited for a page in the last pass's batch; `pausing`: this pass pauses (its head is
/// admitted under the KV rule of a pause).
pub fn admissions_wait(waited_last_pass: usize, pausing: bool) -> bool {
    waited_last_pass > 0 && !pausing
}

/// Rule 2: whether a pass stalled: no row in its batch, rows that waited for a page, and
/// no resident whose context is still arriving (its arrival could let a row step). The
/// residents are counted only for a pass that could have stalled, not on every pass.
pub fn stalled(batch_rows: usize, waited: usize, awaiting_context: impl FnOnce() -> usize) -> bool {
    batch_rows == 0 && waited > 0 && awaiting_context() == 0
}

/// Rule 2's victim: the newest admission. `by_admission`: the residents, oldest admission
/// first.
pub fn abort_victim(by_admission: impl DoubleEndedIterator<Item = RequestId>) -> Option<RequestId> {
    by_admission.last()
}

/// The error the aborted request's client gets.
pub fn abort_message(total_pages: u32, tokens_per_block: u32) -> String {
    format!(
        "KV cache full ({total_pages} pages of {tokens_per_block} tokens) and every running \
         request needs a page: this newest one is aborted so the others can finish; raise \
         kv_cache_config.max_tokens or lower max_batch_size"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_wait_while_rows_wait_for_a_page_unless_a_pause_admits_its_head() {
        assert!(!admissions_wait(0, false), "nothing waited");
        assert!(admissions_wait(1, false), "a row waited: growth first");
        assert!(
            !admissions_wait(3, true),
            "the KV rule of a pause already promised every resident its pages"
        );
    }

    #[test]
    fn a_pass_stalls_only_when_nothing_steps_rows_wait_and_no_context_is_arriving() {
        assert!(stalled(0, 4, || 0));
        assert!(
            !stalled(1, 4, || 0),
            "a row stepped: it will finish and free pages"
        );
        assert!(
            !stalled(0, 0, || 0),
            "nothing waited (an idle or paused worker)"
        );
        assert!(!stalled(0, 4, || 1), "an arriving context may step");
    }

    #[test]
    fn the_victim_is_the_newest_admission() {
        assert_eq!(abort_victim([7u64, 3, 9].into_iter()), Some(9));
        assert_eq!(abort_victim(std::iter::empty()), None);
    }

    #[test]
    fn the_message_names_the_pool_and_what_to_change() {
        let m = abort_message(8192, 32);
        assert!(m.contains("8192 pages of 32 tokens"), "{m}");
        assert!(m.contains("kv_cache_config.max_tokens"), "{m}");
    }
}

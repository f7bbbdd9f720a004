//! The KV page size the simulated worker uses.
//!
//! The server's pool hands out one page id per 32 tokens: about 4,000 ids to admit a
//! 120k-token context, one more every eight decode steps, and all of them back at release.
//! In the simulator that bookkeeping was a third of every pass. The page size is visible to
//! the scheduler only through refusals (a full pool delays an admission or a growth), so
//! when the pool provably never refuses, at the server's page size and at a larger one,
//! both make identical decisions and the simulator takes the larger.

use super::engine::Workload;

/// The server's page size, tokens.
pub const SERVER_PAGE_TOKENS: u32 = 32;

/// The largest page size tried, tokens.
const MAX_PAGE_TOKENS: u32 = 1 << 20;

/// Whether a pool of `kv_tokens` in pages of `page` tokens can give every one of `rows`
/// residents the pages of the largest request (`max_tokens` tokens) at once.
fn never_binds(kv_tokens: u64, rows: u32, max_tokens: u64, page: u32) -> bool {
    let page = u64::from(page.max(1));
    let per_row = max_tokens.div_ceil(page).max(1);
    let total_pages = (kv_tokens / page).min(u64::from(u32::MAX));
    // The worker counts a request's capacity (pages × page) in u32.
    per_row.saturating_mul(page) <= u64::from(u32::MAX)
        && u64::from(rows).saturating_mul(per_row) <= total_pages
}

/// Page size for the simulated pool: the largest power of two up to 2^20 that never binds,
/// if the server's 32-token page never binds either; otherwise the server's page, since the
/// pool then shapes decisions and must be modelled as it is.
pub fn page_tokens(kv_tokens: u64, rows: u32, max_request_tokens: u64) -> u32 {
    if !never_binds(kv_tokens, rows, max_request_tokens, SERVER_PAGE_TOKENS) {
        return SERVER_PAGE_TOKENS;
    }
    let mut page = MAX_PAGE_TOKENS;
    while page > SERVER_PAGE_TOKENS {
        if never_binds(kv_tokens, rows, max_request_tokens, page) {
            return page;
        }
        page /= 2;
    }
    SERVER_PAGE_TOKENS
}

/// An upper bound on the KV tokens one request of `workload` can hold in the worker: its
/// context, its (scaled) output, and one more step of `tokens_per_step` (growth is asked
/// for before the step that finishes a request).
pub fn max_request_tokens(workload: &Workload, output_scale: f64, tokens_per_step: u32) -> u64 {
    let scaled = |out: u32| ((out.max(1) as f64 * output_scale).round() as u32).max(1);
    let one = |input: u32, out: u32| {
        u64::from(input) + u64::from(scaled(out)) + u64::from(tokens_per_step) + 1
    };
    match workload {
        Workload::Sessions(sessions) => sessions
            .iter()
            .flat_map(|s| s.all_requests())
            .map(|(_, r)| one(r.input_tokens, r.output_tokens))
            .max()
            .unwrap_or(0),
        Workload::Timed(requests, _) | Workload::Recorded(requests, _) => requests
            .iter()
            .map(|r| one(r.input_tokens, r.output_tokens))
            .max()
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roomy_pool_gets_the_largest_page_that_still_never_binds() {
        // The reference plant: 200M tokens, 176 rows, requests up to ~650k tokens.
        let p = page_tokens(200_000_000, 176, 650_000);
        assert!(p > SERVER_PAGE_TOKENS);
        assert!(never_binds(200_000_000, 176, 650_000, p));
        assert!(p == MAX_PAGE_TOKENS || !never_binds(200_000_000, 176, 650_000, p * 2));
    }

    #[test]
    fn a_pool_that_can_fill_keeps_the_server_page() {
        // 176 rows of 650k tokens need 114M tokens: a 100M pool can refuse.
        assert_eq!(page_tokens(100_000_000, 176, 650_000), SERVER_PAGE_TOKENS);
        assert_eq!(page_tokens(0, 1, 1), SERVER_PAGE_TOKENS);
    }

    #[test]
    fn rounding_up_to_large_pages_is_accounted_for() {
        // 4 rows of 1,000 tokens in 4,100: whole 1,024-token pages fit (4 of 4), 2,048 do not.
        assert_eq!(page_tokens(4_100, 4, 1_000), 1024);
        // 4 rows of 1,100 tokens in 4,500 fit in 32-token pages (140 of 140) but waste too
        // much in any larger page: the server's page stays.
        assert!(never_binds(4_500, 4, 1_100, 32));
        assert!(!never_binds(4_500, 4, 1_100, 64));
        assert_eq!(page_tokens(4_500, 4, 1_100), SERVER_PAGE_TOKENS);
    }
}

//! Prompt-lookup (n-gram) drafting over a request's rolling window, and the verification that
//! keeps exactly the tokens plain decoding would give. The host side: the CPU reference
//! backend runs it over the arena in host memory; `kernels/draft.cu` runs the same algorithm
//! over the arena in device memory, and the tests below state it once more as plain code.
//!
//! A request slot of the arena (`pools::drafter::DrafterLayout`) holds the count of tokens
//! pushed so far, then a ring of `window` tokens: the last `min(count, window)` tokens of the
//! request's sequence (prompt, then every emitted token). Its last token is always the next
//! step's input.
//!
//! Drafting: for n from `max_ngram` down to 1, take the window's last n tokens as the key and
//! find its most recent earlier occurrence; the draft is what followed it, read as if the
//! draft itself were appended (so a short period repeats: `a b a b` drafts `a b a b ...`).
//! Verification: the verify pass samples a token at each of the k + 1 positions (the input,
//! then each draft); draft i is accepted while it equals the token sampled before it. The
//! emitted tokens are the sampled ones up to and including the first that was not a
//! confirmed draft. Each sampled token depends only on the logits at its position and the
//! request's (seed, position) key, and the logits at a position depend only on the tokens
//! before it, so every emitted token is the one plain decoding emits there: for greedy
//! requests and for seeded sampling alike.

use crate::pools::drafter::DrafterLayout;

/// How the drafter proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftConfig {
    /// Tokens each request slot keeps.
    pub window: u32,
    /// Draft tokens per step (k).
    pub max_draft_len: u32,
    /// Longest n-gram matched.
    pub max_ngram: u32,
}

impl DraftConfig {
    /// Checks what the verify pass and the kernels rely on.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_draft_len == 0 || self.max_draft_len > crate::config::MAX_DRAFT_LEN {
            return Err(format!(
                "max_draft_len {} (supported: 1 to {})",
                self.max_draft_len,
                crate::config::MAX_DRAFT_LEN
            ));
        }
        if self.max_ngram == 0 || self.window < self.max_ngram + self.max_draft_len {
            return Err(format!(
                "a window of {} tokens cannot hold an n-gram of {} and a draft of {}",
                self.window, self.max_ngram, self.max_draft_len
            ));
        }
        Ok(())
    }
}

/// Empties a request slot (a new request takes it).
pub fn reset(slot: &mut [u32]) {
    slot[0] = 0;
}

/// Appends `tokens` to a request slot's ring.
pub fn push(slot: &mut [u32], tokens: &[u32]) {
    let w = slot.len() - DrafterLayout::HEADER_WORDS as usize;
    if w == 0 {
        return;
    }
    let mut n = slot[0];
    for &t in tokens {
        slot[1 + n as usize % w] = t;
        n = n.wrapping_add(1);
    }
    slot[0] = n;
}

/// The slot's window, oldest token first.
pub fn window(slot: &[u32]) -> Vec<u32> {
    let w = slot.len() - DrafterLayout::HEADER_WORDS as usize;
    let n = slot[0] as usize;
    let len = n.min(w);
    (n - len..n).map(|p| slot[1 + p % w]).collect()
}

/// Window token `i` (0 = oldest) of a ring of `w` holding `len` of `n` pushed tokens.
fn at(slot: &[u32], w: usize, n: usize, len: usize, i: usize) -> u32 {
    slot[1 + (n - len + i) % w]
}

/// Up to `cap` draft tokens for the slot's next step into `out` (cleared first).
pub fn propose(slot: &[u32], max_ngram: u32, cap: u32, out: &mut Vec<u32>) {
    out.clear();
    let w = slot.len() - DrafterLayout::HEADER_WORDS as usize;
    let n = slot[0] as usize;
    let len = n.min(w);
    if cap == 0 || len < 2 {
        return;
    }
    for g in (1..=(max_ngram as usize).min(len - 1)).rev() {
        // The key is window[len-g..len]; candidates end before the key's last token.
        let found = (0..len - g).rev().find(|&j| {
            (0..g).all(|t| at(slot, w, n, len, j + t) == at(slot, w, n, len, len - g + t))
        });
        if let Some(j) = found {
            for i in 0..cap as usize {
                let src = j + g + i;
                let t = if src < len {
                    at(slot, w, n, len, src)
                } else {
                    out[src - len]
                };
                out.push(t);
            }
            return;
        }
    }
}

/// How many drafts the verify pass accepted: the longest prefix with `drafts[i] ==
/// sampled[i]` (`sampled[i]` is the token sampled at draft i's position). The row then emits
/// `sampled[..=accepted]`.
pub fn accepted(drafts: &[u32], sampled: &[u32]) -> usize {
    drafts
        .iter()
        .zip(sampled)
        .take_while(|(d, s)| d == s)
        .count()
}

/// The drafter arena of the CPU reference backend, in host memory, laid out as the device's.
#[derive(Debug, Clone)]
pub struct HostArena {
    pub layout: DrafterLayout,
    pub words: Vec<u32>,
}

impl HostArena {
    pub fn new(layout: DrafterLayout) -> Self {
        HostArena {
            layout,
            words: vec![0; layout.total_words() as usize],
        }
    }

    pub fn slot(&self, slot: u32) -> &[u32] {
        let r = self.layout.request_range(slot);
        &self.words[r.start as usize..r.end as usize]
    }

    pub fn slot_mut(&mut self, slot: u32) -> &mut [u32] {
        let r = self.layout.request_range(slot);
        &mut self.words[r.start as usize..r.end as usize]
    }

    /// Scratch row `row`: the draft's length, then its tokens.
    pub fn scratch_mut(&mut self, row: u32) -> &mut [u32] {
        let r = self.layout.scratch_range(row);
        &mut self.words[r.start as usize..r.end as usize]
    }
}

/// Accepted drafts and verify steps, for the accepted-tokens-per-step measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Rows computed by a verify pass.
    pub rows: u64,
    /// Tokens those rows emitted (accepted drafts + one each).
    pub emitted: u64,
    /// Draft tokens proposed.
    pub drafted: u64,
}

impl DraftStats {
    /// Mean tokens a computed row emitted per step.
    pub fn tokens_per_step(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.emitted as f64 / self.rows as f64
        }
    }

    /// Fraction of drafted tokens accepted.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            (self.emitted - self.rows) as f64 / self.drafted as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn slot_with(window: usize, seq: &[u32]) -> Vec<u32> {
        let mut s = vec![0; 1 + window];
        push(&mut s, seq);
        s
    }

    /// The rule stated over a plain vector of the window's tokens.
    fn naive(win: &[u32], max_ngram: usize, cap: usize) -> Vec<u32> {
        let len = win.len();
        if cap == 0 || len < 2 {
            return Vec::new();
        }
        for g in (1..=max_ngram.min(len - 1)).rev() {
            let key = &win[len - g..];
            let mut best = None;
            for j in 0..len - g {
                if &win[j..j + g] == key {
                    best = Some(j);
                }
            }
            if let Some(j) = best {
                let mut seq = win.to_vec();
                for i in 0..cap {
                    let t = seq[j + g + i];
                    seq.push(t);
                }
                return seq[len..].to_vec();
            }
        }
        Vec::new()
    }

    #[test]
    fn a_repeated_phrase_drafts_its_continuation() {
        let s = slot_with(32, &[5, 6, 7, 8, 9, 1, 2, 5, 6, 7]);
        let mut d = Vec::new();
        propose(&s, 3, 4, &mut d);
        assert_eq!(d, [8, 9, 1, 2], "after 5 6 7 came 8 9 1 2");
        propose(&s, 3, 2, &mut d);
        assert_eq!(d, [8, 9]);
    }

    #[test]
    fn a_short_period_repeats_itself_and_no_match_drafts_nothing() {
        let s = slot_with(8, &[1, 2, 3, 4, 3, 4]);
        let mut d = Vec::new();
        propose(&s, 3, 5, &mut d);
        assert_eq!(d, [3, 4, 3, 4, 3]);
        let s = slot_with(8, &[1, 2, 3, 4, 5]);
        propose(&s, 3, 5, &mut d);
        assert!(d.is_empty());
    }

    #[test]
    fn the_ring_keeps_the_last_window_tokens_in_order() {
        let mut s = vec![0; 1 + 4];
        push(&mut s, &[1, 2, 3]);
        assert_eq!(window(&s), [1, 2, 3]);
        push(&mut s, &[4, 5, 6]);
        assert_eq!(window(&s), [3, 4, 5, 6]);
        reset(&mut s);
        assert!(window(&s).is_empty());
    }

    #[test]
    fn acceptance_stops_at_the_first_mismatch() {
        assert_eq!(accepted(&[4, 5, 6], &[4, 5, 9, 1]), 2);
        assert_eq!(accepted(&[4, 5, 6], &[1, 5, 6, 7]), 0);
        assert_eq!(accepted(&[], &[3]), 0);
        assert_eq!(accepted(&[4, 5], &[4, 5, 8]), 2);
    }

    #[test]
    fn a_config_whose_window_cannot_hold_a_key_and_a_draft_is_refused() {
        let ok = DraftConfig {
            window: 8,
            max_draft_len: 4,
            max_ngram: 3,
        };
        ok.validate().unwrap();
        let short = DraftConfig { window: 6, ..ok };
        assert!(short.validate().unwrap_err().contains("window of 6"));
        let zero = DraftConfig {
            max_draft_len: 0,
            ..ok
        };
        assert!(zero.validate().is_err());
    }

    proptest! {
        /// The ring-buffer drafter equals the rule over the plain window, for any sequence
        /// pushed in any chunks, with a small alphabet so matches are common.
        #[test]
        fn ring_drafts_equal_the_plain_rule(
            seq in prop::collection::vec(0u32..4, 0..80),
            chunk in 1usize..7,
            window in 2usize..24,
            max_ngram in 1u32..5,
            cap in 0u32..8,
        ) {
            let mut s = vec![0; 1 + window];
            for c in seq.chunks(chunk) {
                push(&mut s, c);
            }
            let tail = &seq[seq.len().saturating_sub(window)..];
            prop_assert_eq!(window_of(&s), tail.to_vec());
            let mut d = Vec::new();
            propose(&s, max_ngram, cap, &mut d);
            prop_assert_eq!(d, naive(tail, max_ngram as usize, cap as usize));
        }
    }

    fn window_of(s: &[u32]) -> Vec<u32> {
        window(s)
    }
}

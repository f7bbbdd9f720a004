//! Properties of the context transform (`genslot::workload::ContextTransform`), the one
//! function the simulator and the load generator both apply to a trace: lengths are monotone
//! and bounded, and prefix relations between prompts survive.

use genslot::workload::{ContextTransform, HashIds};
use proptest::prelude::*;

const BLOCK: u32 = 64;

fn transform() -> impl Strategy<Value = ContextTransform> {
    (
        prop_oneof![Just(1.0), 0.001..=1.0f64, Just(1.0 / 32.0), Just(0.5)],
        prop::option::of(1u32..200_000),
    )
        .prop_map(|(f, n)| ContextTransform::new(Some(f), n).expect("valid settings"))
}

/// A prompt of `blocks` full blocks plus `extra` tokens, with distinct ids from `first`.
fn prompt(first: u64, blocks: usize, extra: u32) -> (HashIds, u32) {
    let ids: Vec<u64> = (first..first + blocks as u64).collect();
    (HashIds::from_ids(&ids), blocks as u32 * BLOCK + extra)
}

fn lcp(a: &HashIds, b: &HashIds) -> usize {
    a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count()
}

fn apply(x: &ContextTransform, ids: &HashIds, len: u32) -> (HashIds, u32) {
    let n = x.tokens(len);
    (x.hash_ids(ids, n, BLOCK), n)
}

proptest! {
    #[test]
    fn lengths_are_monotone_and_bounded(
        x in transform(),
        a in 0u32..2_000_000,
        b in 0u32..2_000_000,
    ) {
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(x.tokens(lo) <= x.tokens(hi));
        for l in [lo, hi] {
            let n = x.tokens(l);
            prop_assert!(n <= l);
            prop_assert!(x.max_context().is_none_or(|cap| n <= cap));
            prop_assert_eq!(n == 0, l == 0, "a prompt never vanishes");
            // Within rounding of F·L, unless capped.
            let want = x.scale() * f64::from(l);
            if x.max_context().is_none_or(|cap| want < f64::from(cap)) && l > 0 {
                prop_assert!((f64::from(n) - want).abs() <= 0.5 || n == 1);
            }
        }
    }

    #[test]
    fn kept_blocks_fit_the_new_length_and_count_floor_f_m(
        x in transform(),
        blocks in 0usize..3_000,
        extra in 0u32..64,
    ) {
        let (ids, len) = prompt(1, blocks, extra);
        let (out, n) = apply(&x, &ids, len);
        prop_assert!(out.len() <= n.div_ceil(BLOCK) as usize, "blocks cover at most the prompt");
        let kept = (x.scale() * blocks as f64).floor() as usize;
        prop_assert_eq!(out.len(), kept.min(n.div_ceil(BLOCK) as usize));
        // Kept ids keep their order: a subsequence of the recorded ones.
        let v = out.to_vec();
        prop_assert!(v.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_prompt_that_extends_another_still_extends_it(
        x in transform(),
        blocks in 0usize..2_000,
        more in 0usize..500,
        extra in 0u32..64,
    ) {
        let (short_ids, short_len) = prompt(1, blocks, extra);
        let (long_ids, long_len) = prompt(1, blocks + more, extra);
        let (s, sn) = apply(&x, &short_ids, short_len);
        let (l, ln) = apply(&x, &long_ids, long_len);
        prop_assert!(sn <= ln);
        prop_assert_eq!(lcp(&s, &l), s.len(), "the short prompt's blocks lead the long one's");
    }

    #[test]
    fn prompts_that_share_m_blocks_share_floor_f_m_after(
        x in transform(),
        shared in 0usize..2_000,
        a_more in 0usize..400,
        b_more in 0usize..400,
    ) {
        // Shared prefix, then ids no other prompt uses.
        let shared_ids: Vec<u64> = (1..=shared as u64).collect();
        let mk = |tail_from: u64, more: usize| {
            let mut ids = shared_ids.clone();
            ids.extend(tail_from..tail_from + more as u64);
            (HashIds::from_ids(&ids), (shared + more) as u32 * BLOCK)
        };
        let (a, al) = mk(1_000_000, a_more);
        let (b, bl) = mk(2_000_000, b_more);
        prop_assert_eq!(lcp(&a, &b), shared);
        let (ta, tal) = apply(&x, &a, al);
        let (tb, tbl) = apply(&x, &b, bl);
        let cover = |n: u32| n.div_ceil(BLOCK) as usize;
        let want = ((x.scale() * shared as f64).floor() as usize)
            .min(cover(tal))
            .min(cover(tbl));
        prop_assert_eq!(lcp(&ta, &tb), want);
    }

    #[test]
    fn the_identity_changes_nothing(blocks in 0usize..500, extra in 0u32..64) {
        let x = ContextTransform::new(None, None).expect("identity");
        let (ids, len) = prompt(7, blocks, extra);
        let (out, n) = apply(&x, &ids, len);
        prop_assert_eq!(n, len);
        prop_assert_eq!(out, ids);
    }
}

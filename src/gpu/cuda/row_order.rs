//! The order a decode step's rows go to the GPU in: longest context first.
//!
//! With one attention split a row (batch 64 and up), the tensor-core attention runs one
//! block per (kv head, row), and a block's time is its row's context. The chip takes the
//! blocks in launch order as slots free up, so a long row launched last runs alone at the
//! end of the kernel while the rest of the chip idles. Served batches mix contexts of a few
//! hundred to thousands of tokens; launched longest first the blocks pack as the classic
//! longest-processing-time rule packs jobs on machines (BENCHMARKS.md §3.17 measures the
//! step both ways). Rows are independent in every kernel of a decode step, so the order
//! changes which row a block serves, never a row's numbers.

/// The order that puts the longest contexts first (ties keep their batch order), or `None`
/// when `context_lens` is already in that order.
pub fn longest_first(context_lens: &[u32]) -> Option<Vec<usize>> {
    if context_lens.windows(2).all(|w| w[0] >= w[1]) {
        return None;
    }
    let mut order: Vec<usize> = (0..context_lens.len()).collect();
    // Stable: equal lengths keep their order.
    order.sort_by(|&a, &b| context_lens[b].cmp(&context_lens[a]));
    Some(order)
}

/// `items` in `order` (`order[i]` is the batch row that goes to position i).
pub fn permuted<T: Clone>(items: &[T], order: &[usize]) -> Vec<T> {
    order.iter().map(|&i| items[i].clone()).collect()
}

/// Undoes [`permuted`]: `out[i]` came from position i, so it goes back to row `order[i]`.
pub fn restored<T: Default>(out: Vec<T>, order: &[usize]) -> Vec<T> {
    let mut back: Vec<T> = std::iter::repeat_with(T::default).take(out.len()).collect();
    for (x, &row) in out.into_iter().zip(order) {
        if let Some(slot) = back.get_mut(row) {
            *slot = x;
        }
    }
    back
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_already_longest_first_is_left_alone() {
        assert_eq!(longest_first(&[]), None);
        assert_eq!(longest_first(&[7]), None);
        assert_eq!(longest_first(&[900, 900, 40, 3]), None);
    }

    #[test]
    fn longer_rows_go_first_and_ties_keep_their_batch_order() {
        assert_eq!(
            longest_first(&[10, 300, 10, 4000, 300]),
            Some(vec![3, 1, 4, 0, 2])
        );
    }

    #[test]
    fn restoring_a_permuted_batch_gives_every_row_back_its_own_output() {
        let lens = [5u32, 80, 17, 80, 2, 640];
        let order = longest_first(&lens).unwrap();
        let sent = permuted(&lens, &order);
        assert!(sent.windows(2).all(|w| w[0] >= w[1]), "{sent:?}");
        // The GPU's output for a row is a function of what that row sent.
        let out: Vec<u64> = sent.iter().map(|&l| u64::from(l) * 3 + 1).collect();
        let back = restored(out, &order);
        let want: Vec<u64> = lens.iter().map(|&l| u64::from(l) * 3 + 1).collect();
        assert_eq!(back, want);
    }
}

//! The two prompt sets the drafter is measured on: one whose answers repeat what the prompt
//! or the answer already holds (where prompt lookup accepts), one whose answers do not. As
//! chat questions for a real model, and as token ids for random-weight shapes (which have no
//! tokenizer: a phrase repeated, against ids that never repeat).

/// Chat questions whose answers copy or repeat.
pub const REPETITIVE: &[&str] = &[
    "Repeat this sentence three times: The quick brown fox jumps over the lazy dog.",
    "Write the numbers from 1 to 40, separated by commas.",
    "Copy this code exactly: for i in range(10):\n    print(i * i)\nfor j in range(10):\n    print(j * j)",
    "List the days of the week, then list them again in the same order.",
];

/// Chat questions whose answers are new text.
pub const NON_REPETITIVE: &[&str] = &[
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "Explain photosynthesis in one sentence.",
    "Give me three tips for sleeping well.",
];

/// Prompt `i` of the synthetic set for a vocabulary of `vocab` ids: with `repetitive`, an
/// 8-token phrase four times; otherwise 32 ids of a multiplicative sequence that does not
/// repeat within the prompt.
pub fn synthetic(repetitive: bool, vocab: u32, i: u32) -> Vec<u32> {
    let id = |k: u32| (k.wrapping_mul(2_654_435_761) >> 7) % vocab;
    if repetitive {
        let phrase: Vec<u32> = (0..8).map(|k| id(1000 * i + k)).collect();
        phrase.repeat(4)
    } else {
        (0..32).map(|k| id(1000 * i + 97 * k + 13)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_sets_repeat_and_do_not() {
        for i in 0..4 {
            let r = synthetic(true, 1024, i);
            assert_eq!(r.len(), 32);
            assert_eq!(r[..8], r[24..]);
            let n = synthetic(false, 1024, i);
            let mut d = n.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), n.len(), "prompt {i} repeats an id: {n:?}");
            assert!(n.iter().all(|&t| t < 1024));
        }
    }
}

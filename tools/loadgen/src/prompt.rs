//! Prompt synthesis of an exact token length with trace-faithful prefix sharing.
//!
//! A prompt of N tokens is N space-separated words, so a word-level tokenizer counts exactly
//! N tokens (BPE tokenizers count close to N: every word comes from a list of short, common
//! English words that are single tokens with a leading space). The prompt is cut into blocks of
//! `block_size` tokens, one per trace hash id; a block's words are a pure function of
//! `(salt, hash id, position)`, so two requests that share leading hash ids share a
//! byte-identical prefix and prefix caching behaves as in the recorded traffic. Blocks beyond
//! the recorded hash ids get words unique to the request. The salt busts the cache between
//! independent replays of the same trace, as AgentX replays do.

/// Short words that common BPE vocabularies keep as one token each.
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "was", "with", "he", "as",
    "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which",
    "one", "you", "were", "all", "we", "her", "she", "there", "would", "their", "will", "when",
    "who", "him", "been", "has", "more", "if", "no", "out", "so", "said", "what", "up", "its",
    "about", "than", "into", "them", "can", "only", "other", "new", "some", "could", "time",
    "these",
];

/// First token id used for token-id prompts; ids below it are often special tokens.
const FIRST_TOKEN_ID: u32 = 1000;
/// Token ids are drawn from `FIRST_TOKEN_ID .. FIRST_TOKEN_ID + TOKEN_ID_SPAN`.
const TOKEN_ID_SPAN: u64 = 16_000;

/// What a prompt must look like.
#[derive(Debug, Clone, Copy)]
pub struct PromptSpec<'a> {
    pub input_tokens: u32,
    /// Prefix-block hash ids of the recorded request (may be empty).
    pub hash_ids: &'a [u64],
    /// Tokens per hash id (64 for Weka, 512 for Mooncake).
    pub block_size: u32,
    /// Separates independent replays: the same hash id under two salts gives different text.
    pub salt: u64,
    /// Seeds the words of blocks that have no recorded hash id.
    pub request_id: u64,
}

/// splitmix64: a tiny, well-mixed, stable hash (the prompt text must not change across
/// versions of the standard library, so `DefaultHasher` is out).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Calls `f(seed)` once per token position with the seed that decides that token.
fn for_each_token_seed(spec: &PromptSpec<'_>, mut f: impl FnMut(u64)) {
    let block = u64::from(spec.block_size.max(1));
    let salt = mix(spec.salt);
    let own = mix(salt ^ mix(spec.request_id ^ 0xA5A5_A5A5_A5A5_A5A5));
    for pos in 0..u64::from(spec.input_tokens) {
        let b = (pos / block) as usize;
        let base = match spec.hash_ids.get(b) {
            Some(&h) => mix(salt ^ mix(h)),
            None => mix(own ^ b as u64),
        };
        f(mix(base ^ (pos % block)));
    }
}

/// Text of exactly `spec.input_tokens` words.
pub fn text_prompt(spec: &PromptSpec<'_>) -> String {
    let mut s = String::with_capacity(spec.input_tokens as usize * 5);
    for_each_token_seed(spec, |seed| {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[(seed % WORDS.len() as u64) as usize]);
    });
    s
}

/// Exactly `spec.input_tokens` token ids.
pub fn token_id_prompt(spec: &PromptSpec<'_>) -> Vec<u32> {
    let mut ids = Vec::with_capacity(spec.input_tokens as usize);
    for_each_token_seed(spec, |seed| {
        ids.push(FIRST_TOKEN_ID + (seed % TOKEN_ID_SPAN) as u32);
    });
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(input_tokens: u32, hash_ids: &[u64], salt: u64, request_id: u64) -> PromptSpec<'_> {
        PromptSpec {
            input_tokens,
            hash_ids,
            block_size: 4,
            salt,
            request_id,
        }
    }

    #[test]
    fn a_word_level_tokenizer_counts_exactly_the_requested_tokens() {
        for n in [0u32, 1, 3, 4, 5, 17, 1000] {
            let text = text_prompt(&spec(n, &[7, 8], 1, 2));
            assert_eq!(text.split_whitespace().count(), n as usize);
            assert_eq!(token_id_prompt(&spec(n, &[7, 8], 1, 2)).len(), n as usize);
        }
    }

    #[test]
    fn shared_leading_hash_ids_give_a_byte_identical_prefix() {
        let a = text_prompt(&spec(12, &[1, 2, 3], 9, 100));
        let b = text_prompt(&spec(12, &[1, 2, 4], 9, 200));
        let wa: Vec<&str> = a.split(' ').collect();
        let wb: Vec<&str> = b.split(' ').collect();
        assert_eq!(wa[..8], wb[..8]);
        assert_ne!(wa[8..], wb[8..]);
    }

    #[test]
    fn a_different_salt_busts_the_shared_prefix() {
        let a = token_id_prompt(&spec(8, &[1, 2], 1, 5));
        let b = token_id_prompt(&spec(8, &[1, 2], 2, 5));
        assert_ne!(a[..4], b[..4]);
    }

    #[test]
    fn blocks_without_hash_ids_differ_between_requests() {
        let a = token_id_prompt(&spec(8, &[], 1, 5));
        let b = token_id_prompt(&spec(8, &[], 1, 6));
        assert_ne!(a, b);
    }
}

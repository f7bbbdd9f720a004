//! Text ⇄ token ids for the HTTP layer. The default is a deterministic word tokenizer that
//! needs no model files: it exists so token counts (prompt length, `usage`) are meaningful
//! with random-weight models. A real tokenizer plugs in through [`Tokenizer`].

use serde::Deserialize;

/// What the server needs from a tokenizer.
pub trait Tokenizer: Send + Sync + 'static {
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The text piece of one generated token, as streamed to the client.
    fn decode_token(&self, id: u32) -> String;
    /// Token ids a prompt may use are `0..vocab_size`; `None` when unknown (not checked).
    fn vocab_size(&self) -> Option<u32> {
        None
    }
    /// The prompt text for a chat conversation, ending where the assistant's reply begins.
    fn render_chat(&self, messages: &[ChatTurn]) -> String {
        render_chatml(messages)
    }
    /// [`render_chat`](Self::render_chat) for a template that can refuse a conversation
    /// (a model's own Jinja template raising on, say, an unsupported role order); the error
    /// is the template's message, for a 400.
    fn try_render_chat(&self, messages: &[ChatTurn]) -> Result<String, String> {
        Ok(self.render_chat(messages))
    }
    /// The text of a whole generation. Unlike concatenated `decode_token`s it joins a
    /// character whose bytes span several byte-level tokens.
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&id| self.decode_token(id)).collect()
    }
}

/// One chat message with its text content already extracted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
}

/// ChatML (`<|im_start|>role\n…<|im_end|>\n`), the template of SmolLM2 and Qwen.
pub fn render_chatml(messages: &[ChatTurn]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// Splits text into GPT-style pieces (a word with its leading space, a digit run, one
/// punctuation mark, a newline, a run of spaces) and hashes each piece into the id space.
/// Output ids decode to common English words with a leading space, each of which encodes
/// back to exactly one piece, so a client that re-tokenizes the streamed text counts the
/// same number of tokens as `usage` reports (exactly with this tokenizer; approximately with
/// a BPE tokenizer, where these words are usually single tokens).
#[derive(Debug, Clone)]
pub struct WordTokenizer {
    vocab_size: u32,
}

/// Words longer than this many letters are split, roughly as BPE splits rare long words.
const MAX_WORD_CHARS: usize = 8;
/// Digit runs are split in threes, as Llama 3's pre-tokenizer does.
const MAX_DIGITS: usize = 3;

impl WordTokenizer {
    /// `vocab_size` bounds the ids of encoded text (the model's embedding rows); at least 1.
    pub fn new(vocab_size: u32) -> Self {
        WordTokenizer {
            vocab_size: vocab_size.max(1),
        }
    }

    /// The text pieces `encode` assigns one id each.
    pub fn pieces(text: &str) -> Vec<&str> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let len = next_piece_len(rest);
            pieces.push(&rest[..len]);
            rest = &rest[len..];
        }
        pieces
    }
}

impl Default for WordTokenizer {
    /// Llama 2's vocabulary size; ids stay valid for any model with at least as many rows.
    fn default() -> Self {
        WordTokenizer::new(32_000)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Alpha,
    Digit,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_ascii_alphabetic() {
        Class::Alpha
    } else if c.is_ascii_digit() {
        Class::Digit
    } else if c == ' ' || c == '\t' {
        Class::Space
    } else {
        Class::Other
    }
}

/// Byte length of the piece at the start of `s` (non-empty).
fn next_piece_len(s: &str) -> usize {
    let mut chars = s.char_indices().peekable();
    let Some((_, first)) = chars.next() else {
        return 0;
    };
    // A single space joins the word that follows it, as in GPT-2 pieces (" the").
    let (start_class, mut len, mut count) = match (class(first), chars.peek()) {
        (Class::Space, Some(&(i, c))) if first == ' ' && class(c) != Class::Space => {
            chars.next();
            (class(c), i + c.len_utf8(), 1)
        }
        (cl, _) => (cl, first.len_utf8(), 1),
    };
    let limit = match start_class {
        Class::Alpha | Class::Space => MAX_WORD_CHARS,
        Class::Digit => MAX_DIGITS,
        // Punctuation, newlines and non-ASCII characters are one piece each.
        Class::Other => return len,
    };
    for (i, c) in chars {
        if class(c) != start_class || count >= limit {
            break;
        }
        len = i + c.len_utf8();
        count += 1;
    }
    len
}

/// FNV-1a: stable across runs, platforms and Rust versions (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Tokenizer for WordTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        Self::pieces(text)
            .into_iter()
            // The remainder is < vocab_size ≤ u32::MAX, so the cast is lossless.
            .map(|p| (fnv1a(p.as_bytes()) % u64::from(self.vocab_size)) as u32)
            .collect()
    }

    fn decode_token(&self, id: u32) -> String {
        let word = OUTPUT_WORDS[id as usize % OUTPUT_WORDS.len()];
        format!(" {word}")
    }

    fn vocab_size(&self) -> Option<u32> {
        Some(self.vocab_size)
    }
}

/// Frequent English words, at most `MAX_WORD_CHARS` letters so " word" stays one piece. Each
/// with its leading space was one token in a byte-level BPE trained on AIPerf's Shakespeare
/// corpus (vocabulary 8000); large English BPEs should split them no more.
pub(crate) const OUTPUT_WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "he", "it", "an", "are", "were", "which", "be", "this", "or", "had", "not",
    "but", "have", "their", "they", "one", "all", "been", "has", "its", "who", "more", "her",
    "also", "she", "would", "can", "other", "there", "when", "into", "first", "after", "so",
    "only", "two", "time", "new", "some", "them", "out", "over", "up", "if", "no", "what", "about",
    "may", "than", "most", "many", "such", "these", "we", "could", "any", "year", "made",
    "between", "king", "where", "three", "people", "under", "then", "city", "while", "world",
    "both", "love", "used", "state", "each", "well", "since", "part", "own", "like", "being",
    "work", "through", "known", "same", "name", "way", "last", "school", "back", "early", "long",
    "heart", "life", "before", "game", "just", "season", "house", "until", "found", "high", "did",
    "very", "our", "how", "will", "you", "make", "day", "good", "small", "take", "old", "great",
    "right", "home", "end", "place", "show", "water", "war", "men", "hand", "line", "days", "word",
    "number", "night", "open", "left", "power", "field",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_words_spaces_digits_and_punctuation() {
        assert_eq!(
            WordTokenizer::pieces("Hello world, 12345!\n  ok"),
            vec!["Hello", " world", ",", " 123", "45", "!", "\n", "  ", "ok"]
        );
    }

    #[test]
    fn pieces_cover_the_text_exactly_including_unicode() {
        let text = "naïve café — 東京 \t\ttabs   and  extraordinarily long words";
        assert_eq!(WordTokenizer::pieces(text).concat(), text);
        assert!(WordTokenizer::pieces("extraordinarily")
            .iter()
            .all(|p| p.chars().count() <= MAX_WORD_CHARS));
    }

    #[test]
    fn encoding_is_deterministic_and_within_the_vocabulary() {
        let t = WordTokenizer::new(1000);
        let ids = t.encode("The quick brown fox jumps over the lazy dog.");
        assert_eq!(
            ids,
            t.encode("The quick brown fox jumps over the lazy dog.")
        );
        assert_eq!(ids.len(), 10);
        assert!(ids.iter().all(|&id| id < 1000));
        assert_eq!(t.encode(" the"), t.encode(" the the")[..1]);
    }

    #[test]
    fn every_output_token_reencodes_to_exactly_one_token() {
        let t = WordTokenizer::default();
        for id in 0..OUTPUT_WORDS.len() as u32 * 2 {
            let piece = t.decode_token(id);
            assert_eq!(t.encode(&piece).len(), 1, "piece {piece:?}");
        }
        let text: String = (0..500u32).map(|i| t.decode_token(i * 7919)).collect();
        assert_eq!(t.encode(&text).len(), 500);
    }

    proptest::proptest! {
        #[test]
        fn pieces_of_any_text_are_nonempty_and_cover_it(text in "\\PC{0,64}") {
            let pieces = WordTokenizer::pieces(&text);
            proptest::prop_assert!(pieces.iter().all(|p| !p.is_empty()));
            proptest::prop_assert_eq!(pieces.concat(), text.clone());
            proptest::prop_assert_eq!(WordTokenizer::default().encode(&text).len(), pieces.len());
        }
    }

    #[test]
    fn chatml_ends_at_the_assistant_turn() {
        let turns = [
            ChatTurn {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatTurn {
                role: "user".into(),
                content: "Hi".into(),
            },
        ];
        assert_eq!(
            render_chatml(&turns),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}

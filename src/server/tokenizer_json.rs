//! The default [`WordTokenizer`] as a Hugging Face `tokenizer.json`, so a client that counts
//! tokens itself (AIPerf, without `--use-server-token-count`) counts what `usage` reports.
//!
//! The file splits text with [`PIECE_PATTERN`] (the same pieces as
//! [`WordTokenizer::pieces`]) and maps each piece to one token of a word-level vocabulary,
//! so every piece is one token whether it is in the vocabulary or not (then `[UNK]`). The
//! vocabulary holds the server's output words, every ASCII character, every digit run and
//! the pieces of the corpora it is built from (e.g. AIPerf's prompt corpus), so that text
//! made of them decodes back exactly (the decoder concatenates pieces). The shipped copy
//! is `assets/word-tokenizer/`, written by `cargo run --example word_tokenizer_json`.

use serde_json::{json, Map, Value};

use super::tokenize::{WordTokenizer, OUTPUT_WORDS};

/// [`WordTokenizer::pieces`] as one regex (Oniguruma and fancy-regex read it the same way;
/// the leftmost alternative that matches wins): a word of up to 8 ASCII letters, a run of up
/// to 3 digits, or one other character, each with one optional leading space; else a run of
/// up to 8 spaces and tabs.
pub const PIECE_PATTERN: &str = r" ?[A-Za-z]{1,8}| ?[0-9]{1,3}| ?[^A-Za-z0-9 \t]|[ \t]{1,8}";

/// The token a piece outside the vocabulary becomes.
pub const UNK: &str = "[UNK]";

/// The vocabulary: `[UNK]`, the output words, single characters, digit runs and space runs,
/// then the pieces of `corpora` in order of first appearance; no piece twice.
pub fn vocabulary<'a>(corpora: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut vocab = Vec::new();
    let mut add = |piece: String| {
        if seen.insert(piece.clone()) {
            vocab.push(piece);
        }
    };
    add(UNK.to_owned());
    for w in OUTPUT_WORDS {
        add(format!(" {w}"));
        add((*w).to_owned());
    }
    for c in (0x21u8..0x7f).map(char::from).chain(['\n', '\r', '\t']) {
        add(c.to_string());
        add(format!(" {c}"));
    }
    for width in 1..=3usize {
        for n in 0..10usize.pow(width as u32) {
            let digits = format!("{n:0width$}");
            add(format!(" {digits}"));
            add(digits);
        }
    }
    for n in 1..=8 {
        add(" ".repeat(n));
    }
    for text in corpora {
        for piece in WordTokenizer::pieces(text) {
            add(piece.to_owned());
        }
    }
    vocab
}

/// `tokenizer.json` for `vocab` (ids are positions).
pub fn tokenizer_json(vocab: &[String]) -> Value {
    let ids: Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, p)| (p.clone(), json!(i)))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": PIECE_PATTERN},
            "behavior": "Isolated",
            "invert": false
        },
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": UNK}
    })
}

/// `tokenizer_config.json` beside it, for `transformers.AutoTokenizer`. It names no special
/// token: `transformers` would match a special token's text before splitting, and `[UNK]`
/// written in a text must stay three pieces, as the server counts it.
pub fn tokenizer_config_json(max_context_tokens: u64) -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_context_tokens
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_holds_each_piece_once_with_unk_first() {
        let v = vocabulary(["To be, or not to be: 1234"]);
        assert_eq!(v[0], UNK);
        let unique: std::collections::HashSet<&String> = v.iter().collect();
        assert_eq!(unique.len(), v.len());
        for piece in [
            " the", "To", " be", ",", " or", " 123", "4", "\n", "        ",
        ] {
            assert!(v.iter().any(|p| p == piece), "{piece:?}");
        }
    }

    #[test]
    fn the_json_names_the_pattern_the_model_and_the_decoder() {
        let j = tokenizer_json(&vocabulary([]));
        assert_eq!(j["pre_tokenizer"]["pattern"]["Regex"], PIECE_PATTERN);
        assert_eq!(j["model"]["vocab"][UNK], 0);
        assert_eq!(j["decoder"]["type"], "Fuse");
    }
}

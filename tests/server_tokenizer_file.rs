//! The shipped `assets/word-tokenizer/tokenizer.json`, read by the Hugging Face `tokenizers`
//! library (what AIPerf's `transformers` uses), counts every text as the server's word
//! tokenizer does and decodes the server's output text back exactly, so a client counting
//! tokens itself agrees with `usage`.

use genslot::server::tokenize::{Tokenizer as _, WordTokenizer};
use genslot::server::tokenizer_json::{vocabulary, PIECE_PATTERN};
use proptest::prelude::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/word-tokenizer");

/// Loaded once: the file holds a 37k-piece vocabulary.
fn shipped() -> &'static tokenizers::Tokenizer {
    static T: std::sync::OnceLock<tokenizers::Tokenizer> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        tokenizers::Tokenizer::from_file(format!("{DIR}/tokenizer.json")).expect("loads")
    })
}

fn count(t: &tokenizers::Tokenizer, text: &str) -> usize {
    t.encode(text, false).expect("encodes").len()
}

#[test]
fn the_shipped_file_uses_the_servers_pieces_and_holds_its_base_vocabulary() {
    let text = std::fs::read_to_string(format!("{DIR}/tokenizer.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["pre_tokenizer"]["pattern"]["Regex"], PIECE_PATTERN);
    let vocab = json["model"]["vocab"].as_object().unwrap();
    for piece in vocabulary([]) {
        assert!(
            vocab.contains_key(&piece),
            "{piece:?} missing: regenerate the file"
        );
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{DIR}/tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
}

#[test]
fn the_servers_output_text_counts_as_usage_and_decodes_back() {
    let t = shipped();
    let w = WordTokenizer::default();
    let text: String = (0..1000u32).map(|i| w.decode_token(i * 7919)).collect();
    let ids = t.encode(text.as_str(), false).unwrap();
    assert_eq!(ids.len(), 1000);
    assert!(
        ids.get_ids().iter().all(|&id| id != 0),
        "every output word is in the vocabulary"
    );
    assert_eq!(t.decode(ids.get_ids(), false).unwrap(), text);
}

proptest! {
    #[test]
    fn any_text_counts_as_the_server_counts_it(text in "\\PC{0,80}") {
        prop_assert_eq!(count(shipped(), &text), WordTokenizer::pieces(&text).len());
    }

    #[test]
    fn ascii_text_with_spaces_tabs_and_newlines_counts_as_the_server_counts_it(
        text in "[a-zA-Z0-9 \\t\\n.,;:!?'\"()\\[\\]-]{0,120}"
    ) {
        prop_assert_eq!(count(shipped(), &text), WordTokenizer::pieces(&text).len());
    }
}

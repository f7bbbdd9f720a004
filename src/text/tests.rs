use super::*;
use crate::gguf::testfile::{strings, GgufBuilder};
use crate::gguf::Value as GValue;

/// GPT-2's reversible byte -> printable character map (`bytes_to_unicode`).
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// The 256 byte symbols, then "bc", "ab", "Ġa", "Ġab", then `<|s|>` (control) and `<x>`
/// (user-defined), then "34" and "12".
fn toy_tokens() -> Vec<String> {
    let mut t: Vec<String> = byte_alphabet().iter().map(|c| c.to_string()).collect();
    t.extend(["bc", "ab", "Ġa", "Ġab", "<|s|>", "<x>", "34", "12"].map(String::from));
    t
}

fn toy_gguf(pre: &str, add_bos: bool, template: Option<&str>) -> Gguf {
    let toks = toy_tokens();
    let refs: Vec<&str> = toks.iter().map(String::as_str).collect();
    let mut types = vec![GValue::I32(1); 260];
    types.extend([
        GValue::I32(3),
        GValue::I32(4),
        GValue::I32(1),
        GValue::I32(1),
    ]);
    let mut b = GgufBuilder::default()
        .kv("tokenizer.ggml.model", GValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", GValue::String(pre.into()))
        .kv("tokenizer.ggml.tokens", strings(&refs))
        .kv("tokenizer.ggml.token_type", GValue::Array(5, types))
        .kv(
            "tokenizer.ggml.merges",
            strings(&["b c", "a b", "Ġ a", "Ġa b", "3 4", "1 2"]),
        )
        .kv("tokenizer.ggml.bos_token_id", GValue::U32(260))
        .kv("tokenizer.ggml.eos_token_id", GValue::U32(260))
        .kv("tokenizer.ggml.add_bos_token", GValue::Bool(add_bos));
    if let Some(t) = template {
        b = b.kv("tokenizer.chat_template", GValue::String(t.into()));
    }
    Gguf::parse(b.build(), "toy.gguf").unwrap()
}

fn turn(role: &str, content: &str) -> ChatTurn {
    ChatTurn {
        role: role.into(),
        content: content.into(),
    }
}

#[test]
fn gguf_bpe_merges_by_rank_and_matches_control_tokens_whole() {
    let t = ModelTokenizer::from_gguf(&toy_gguf("smollm", false, None)).unwrap();
    // "b c" outranks "a b": abc -> a + bc, never ab + c.
    assert_eq!(t.try_encode("abc").unwrap(), [b'a' as u32, 256]);
    assert_eq!(t.try_encode(" ab").unwrap(), [b' ' as u32, 257]);
    assert_eq!(t.try_encode(" abc").unwrap(), [258, 256]);
    assert_eq!(t.try_encode("<|s|>ab<x>").unwrap(), [260, 257, 261]);
    // Digits one by one (smollm), bytes of any UTF-8 text round-trip.
    assert_eq!(t.try_encode("12").unwrap(), [b'1' as u32, b'2' as u32]);
    for s in ["héllo wörld ✓", "a\n\n  b\t", "x 12 345!", "日本語<|s|>"] {
        assert_eq!(t.try_decode(&t.try_encode(s).unwrap()).unwrap(), s);
    }
    assert_eq!(
        (t.bos(), t.eos(), t.vocab_size()),
        (Some(260), Some(260), 264)
    );
}

#[test]
fn gguf_add_bos_token_puts_bos_first_once_even_when_the_template_writes_it() {
    let t = ModelTokenizer::from_gguf(&toy_gguf(
        "gpt-2",
        true,
        Some("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"),
    ))
    .unwrap();
    assert_eq!(t.try_encode("ab").unwrap(), [260, 257]);
    let chat = t.try_render_chat(&[turn("user", "ab")]).unwrap();
    assert_eq!(chat, "<|s|>ab");
    assert_eq!(t.encode(&chat), [260, 257]);
}

#[test]
fn without_a_template_chat_falls_back_to_chatml() {
    let t = ModelTokenizer::from_gguf(&toy_gguf("smollm", false, None)).unwrap();
    assert!(!t.has_template());
    assert_eq!(
        t.try_render_chat(&[turn("user", "Hi")]).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn a_template_that_refuses_a_user_turn_or_an_unknown_pre_tokenizer_fails_at_load() {
    let e = ModelTokenizer::from_gguf(&toy_gguf(
        "smollm",
        false,
        Some("{{ raise_exception('no users here') }}"),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("toy.gguf") && e.contains("cannot render a user turn") && e.contains("no users"),
        "{e}"
    );
    let e = ModelTokenizer::from_gguf(&toy_gguf("mystery", false, None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"mystery\"") && e.contains("not supported"),
        "{e}"
    );
    // A template that raises on some conversations is a per-request error, not a load error.
    let t = ModelTokenizer::from_gguf(&toy_gguf(
        "smollm",
        false,
        Some("{% if messages|length > 1 %}{{ raise_exception('one turn only') }}{% endif %}ok"),
    ))
    .unwrap();
    let e = t
        .try_render_chat(&[turn("user", "a"), turn("user", "b")])
        .unwrap_err();
    assert!(e.contains("one turn only"), "{e}");
}

#[test]
fn each_pre_tokenizer_splits_digits_as_its_regex_says() {
    // Merges "3 4" (rank 4) then "1 2" (rank 5). gpt-2 keeps "1234" one word: 12 + 34;
    // llama-bpe splits runs of three: "123" -> 12 + 3, then "4"; qwen2 and smollm split
    // every digit, so nothing merges.
    let (d1, d2, d3, d4) = (b'1' as u32, b'2' as u32, b'3' as u32, b'4' as u32);
    for (pre, want) in [
        ("gpt-2", vec![263, 262]),
        ("llama-bpe", vec![263, d3, d4]),
        ("qwen2", vec![d1, d2, d3, d4]),
        ("smollm", vec![d1, d2, d3, d4]),
    ] {
        let t = ModelTokenizer::from_gguf(&toy_gguf(pre, false, None)).unwrap();
        assert_eq!(t.try_encode("1234").unwrap(), want, "{pre}");
        for s in ["it's 1234 abc\r\n\n  x", "ÉTÉ ab<|s|>"] {
            assert_eq!(t.try_decode(&t.try_encode(s).unwrap()).unwrap(), s, "{pre}");
        }
    }
}

/// A Hugging Face directory with the toy tokenizer's tokenizer.json.
fn hf_dir(config: Option<Value>, extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let json = gguf::tokenizer_json(&toy_gguf("smollm", false, None)).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.path().join("tokenizer_config.json"), c.to_string()).unwrap();
    }
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

#[test]
fn hf_directory_reads_template_bos_and_eos_from_tokenizer_config() {
    let dir = hf_dir(
        Some(serde_json::json!({
            "bos_token": {"content": "<x>"},
            "eos_token": "<|s|>",
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "{% for m in messages %}[{{ m.role }}]{{ m.content.strip() }}{% endfor %}{{ eos_token }}"}
            ]
        })),
        &[],
    );
    let text = ModelText::load(dir.path()).unwrap();
    let t = &text.tokenizer;
    assert_eq!(
        (t.bos(), t.eos(), text.eos),
        (Some(261), Some(260), Some(260))
    );
    assert_eq!(
        t.try_render_chat(&[turn("user", "  hi ")]).unwrap(),
        "[user]hi<|s|>"
    );
}

#[test]
fn hf_directory_falls_back_to_chat_template_jinja_and_generation_config() {
    let dir = hf_dir(
        Some(serde_json::json!({"bos_token": null})),
        &[
            ("chat_template.jinja", "{{ messages[0].content }}!"),
            ("generation_config.json", r#"{"eos_token_id": [260, 1]}"#),
        ],
    );
    let t = ModelTokenizer::load(dir.path()).unwrap();
    assert_eq!(t.eos(), Some(260));
    assert_eq!(t.try_render_chat(&[turn("user", "x")]).unwrap(), "x!");
    // No config at all: the tokenizer alone, ChatML, no EOS.
    let bare = ModelTokenizer::load(hf_dir(None, &[]).path()).unwrap();
    assert_eq!((bare.eos(), bare.has_template()), (None, false));
    let e = ModelTokenizer::load(tempfile::tempdir().unwrap().path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}

/// A SentencePiece-style tokenizer (Metaspace): decoding a lone "▁the" drops its space, so
/// streamed tokens are decoded after an anchor token and keep it.
#[test]
fn streamed_tokens_keep_the_leading_space_a_metaspace_decoder_strips_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                          "split": true},
        "post_processor": null,
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                    "split": true},
        "model": {"type": "WordLevel", "unk_token": "<unk>",
                  "vocab": {"<unk>": 0, "▁the": 1, "▁cat": 2, "▁a": 3, "s": 4}}
    });
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    let t = ModelTokenizer::load(dir.path()).unwrap();
    assert_eq!(t.try_decode(&[1]).unwrap(), "the");
    let streamed: String = [1u32, 2, 4].iter().map(|&id| t.decode_token(id)).collect();
    assert_eq!(streamed, " the cat".to_string() + "s");
    assert_eq!(t.decode(&[1, 2]), "the cat");
    // Byte-level pieces stream as they are.
    let b = ModelTokenizer::from_gguf(&toy_gguf("smollm", false, None)).unwrap();
    assert_eq!(b.decode_token(258), " a");
    assert_eq!(b.decode_token(260), "<|s|>");
}

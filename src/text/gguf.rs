//! A Hugging Face `tokenizers` tokenizer built from a GGUF file's vocabulary and merges
//! (`tokenizer.ggml.model = "gpt2"`, byte-level BPE): the tokenizer.json llama.cpp's
//! converter started from, rebuilt. The pre-tokenizer follows `tokenizer.ggml.pre` the way
//! llama.cpp does (`llama-vocab.cpp`); control tokens are special added tokens, user-defined
//! tokens plain added tokens; `tokenizer.ggml.add_bos_token` puts BOS first.

use serde_json::{json, Value};

use crate::gguf::Gguf;

/// GGUF token types (llama.cpp's `llama_token_type`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Llama 3's (`llama-bpe`): digits in runs of at most three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: every digit on its own.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
           "use_regex": use_regex})
}

fn split(pattern: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
           "invert": false})
}

/// (pre-tokenizer, normalizer, ignore_merges) for llama.cpp's pre-tokenizer name.
fn pre_tokenizer(pre: &str) -> Option<(Value, Value, bool)> {
    let seq = |v: Vec<Value>| json!({"type": "Sequence", "pretokenizers": v});
    Some(match pre {
        "gpt-2" | "default" => (byte_level(true), Value::Null, false),
        "smollm" => (
            seq(vec![
                json!({"type": "Digits", "individual_digits": true}),
                byte_level(true),
            ]),
            Value::Null,
            false,
        ),
        "llama-bpe" | "llama3" => (
            seq(vec![split(LLAMA3_SPLIT), byte_level(false)]),
            Value::Null,
            true,
        ),
        "qwen2" => (
            seq(vec![split(QWEN2_SPLIT), byte_level(false)]),
            json!({"type": "NFC"}),
            false,
        ),
        _ => return None,
    })
}

/// The pre-tokenizers this builder knows (for error messages).
pub const KNOWN_PRE: &str = "gpt-2, default, smollm, llama-bpe, qwen2";

/// The tokenizer.json for `g`, or why it cannot be built.
pub fn tokenizer_json(g: &Gguf) -> Result<Value, String> {
    let model = g
        .meta_str("tokenizer.ggml.model")
        .map_err(|e| e.to_string())?;
    if model != "gpt2" {
        return Err(format!(
            "tokenizer model {model:?} is not supported (only gpt2, byte-level BPE)"
        ));
    }
    let pre_name = g
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let (pre, normalizer, ignore_merges) = pre_tokenizer(pre_name).ok_or_else(|| {
        format!("pre-tokenizer {pre_name:?} is not supported (supported: {KNOWN_PRE})")
    })?;
    let tokens = g
        .meta_strings("tokenizer.ggml.tokens")
        .map_err(|e| e.to_string())?;
    let merges = g
        .meta_strings("tokenizer.ggml.merges")
        .map_err(|e| e.to_string())?;
    let types = match g.get("tokenizer.ggml.token_type") {
        Some(_) => g
            .meta_ints("tokenizer.ggml.token_type")
            .map_err(|e| e.to_string())?,
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(format!(
            "{} token types for {} tokens",
            types.len(),
            tokens.len()
        ));
    }
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if vocab.insert((*t).to_string(), json!(i)).is_some() {
            return Err(format!("token {i} ({t:?}) is a duplicate"));
        }
    }
    let merges: Vec<Value> = merges
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| format!("merge {rank} ({m:?}) is not two symbols"))
        })
        .collect::<Result<_, _>>()?;
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (t, &ty))| (ty == CONTROL || ty == USER_DEFINED) && !t.is_empty())
        .map(|(i, (t, &ty))| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": ty == CONTROL})
        })
        .collect();
    let add_bos = matches!(
        g.get("tokenizer.ggml.add_bos_token"),
        Some(crate::gguf::Value::Bool(true))
    );
    let bos = g
        .get("tokenizer.ggml.bos_token_id")
        .and_then(|v| v.as_u64())
        .and_then(|id| tokens.get(id as usize).map(|t| (id, *t)));
    let post = match (add_bos, bos) {
        (true, Some((id, t))) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [id], "tokens": [t]}}
        }),
        _ => json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                    "use_regex": true}),
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                  "vocab": vocab, "merges": merges}
    }))
}

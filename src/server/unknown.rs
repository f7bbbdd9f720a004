//! Fields this server does not know. OpenAI's API refuses every unknown field; vLLM and most
//! engines ignore them, and clients and routers send their own extensions freely (AIPerf's
//! extra inputs, a router's transfer parameters), so here too an unknown field is ignored —
//! unless its name shows the client meant a field this server reads: a misspelling
//! (`max_token`, `temprature`, `top-p`), another API's name for it (`max_new_tokens`,
//! `stop_sequences`), or the other endpoint's field (`max_completion_tokens` or `messages` on
//! `/v1/completions`). Ignoring one of those answers another question than the one asked
//! (4,096 tokens where 5 were meant), so it is a 400 naming the field and the one meant.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::error::ApiError;
use super::request::Endpoint;
use super::unsupported;

/// Every top-level field the server implements (`request.rs`, `params.rs`, `arrival.rs`);
/// the ones it refuses unless neutral are `unsupported::names()`.
const IMPLEMENTED: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "ignore_eos",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "arrival_time",
];

/// Every top-level field the server reads, on either endpoint.
fn read() -> impl Iterator<Item = &'static str> {
    IMPLEMENTED.iter().copied().chain(unsupported::names())
}

/// Known fields that change nothing this server computes (bookkeeping, routing, options of
/// features it refuses elsewhere). Never taken for a misspelling: `store` is not `stop`.
const NEUTRAL: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "request_id",
    "priority",
    "cache_salt",
    "kv_transfer_params",
    "add_special_tokens",
    "length_penalty",
    "stream_usage",
];

/// Other APIs' names for a field this server reads.
const ALIASES: &[(&str, &str)] = &[
    ("max_new_tokens", "max_tokens"),
    ("max_output_tokens", "max_tokens"),
    ("max_length", "max_tokens"),
    ("stop_sequences", "stop"),
    ("random_seed", "seed"),
];

/// The fields of `stream_options` this server reads (the rest are ignored).
const STREAM_OPTIONS: &[&str] = &["include_usage", "continuous_usage_stats"];

/// The first field of `body` that looks like one this server reads but is not, as a 400.
pub fn refuse_misnamed(endpoint: Endpoint, body: &Map<String, Value>) -> Result<(), ApiError> {
    for name in body.keys() {
        if let Some(meant) = other_endpoints(endpoint, name) {
            let (here, there) = match endpoint {
                Endpoint::Completions => ("/v1/completions", "/v1/chat/completions"),
                Endpoint::ChatCompletions => ("/v1/chat/completions", "/v1/completions"),
            };
            return Err(misnamed(
                name,
                format!("`{name}` is a field of {there}; {here} reads `{meant}`"),
            ));
        }
        if read().any(|k| k == name) || NEUTRAL.contains(&name.as_str()) {
            continue;
        }
        if let Some(meant) = meant(name, read()) {
            return Err(misnamed(
                name,
                format!("unknown parameter `{name}`; did you mean `{meant}`?"),
            ));
        }
    }
    if let Some(Value::Object(options)) = body.get("stream_options") {
        for name in options.keys() {
            if STREAM_OPTIONS.contains(&name.as_str()) {
                continue;
            }
            if let Some(meant) = meant(name, STREAM_OPTIONS.iter().copied()) {
                return Err(misnamed(
                    name,
                    format!("unknown parameter `stream_options.{name}`; did you mean `{meant}`?"),
                ));
            }
        }
    }
    Ok(())
}

fn misnamed(name: &str, message: String) -> ApiError {
    let mut e = ApiError::invalid("unknown_parameter", None, message);
    e.param = Some(Cow::Owned(name.to_owned()));
    e
}

/// The field `name` stands for on the other endpoint, where it sets what this one reads
/// under another name.
fn other_endpoints(endpoint: Endpoint, name: &str) -> Option<&'static str> {
    match (endpoint, name) {
        (Endpoint::Completions, "max_completion_tokens") => Some("max_tokens"),
        (Endpoint::Completions, "messages") => Some("prompt"),
        (Endpoint::ChatCompletions, "prompt") => Some("messages"),
        _ => None,
    }
}

/// The known field an unknown `name` was meant to be, if it is close enough to one: the
/// same name but for case and `-`/`_`, another API's name for it, or one or two edits away
/// from a name of at least four characters (one edit for names of under eight, where two
/// reach other words; none for `n`, which one edit turns into any letter). The closest
/// wins; a tie goes to the earlier in `known`.
fn meant(name: &str, known: impl Iterator<Item = &'static str>) -> Option<&'static str> {
    let norm = name.to_ascii_lowercase().replace('-', "_");
    let known: Vec<&'static str> = known.collect();
    if let Some(&(_, meant)) = ALIASES.iter().find(|(alias, _)| *alias == norm) {
        return known.contains(&meant).then_some(meant);
    }
    known
        .into_iter()
        .map(|k| (strsim::damerau_levenshtein(&norm, k), k))
        .filter(|&(d, k)| k.len() >= 4 && d <= if k.len() < 8 { 1 } else { 2 })
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(endpoint: Endpoint, body: Value) -> Result<(), ApiError> {
        refuse_misnamed(endpoint, body.as_object().expect("an object"))
    }

    fn meant_of(endpoint: Endpoint, body: Value) -> (String, String) {
        let e = check(endpoint, body).expect_err("refused");
        assert_eq!(e.code, "unknown_parameter");
        (e.param().unwrap_or_default().to_owned(), e.message)
    }

    #[test]
    fn a_misspelt_field_is_refused_naming_it_and_the_field_meant() {
        for (typo, want) in [
            ("max_token", "max_tokens"),
            ("maxtokens", "max_tokens"),
            ("max-tokens", "max_tokens"),
            ("Max_Tokens", "max_tokens"),
            ("temprature", "temperature"),
            ("top-p", "top_p"),
            ("topk", "top_k"),
            ("min_token", "min_tokens"),
            ("ignore_eso", "ignore_eos"),
            ("stops", "stop"),
            ("max_new_tokens", "max_tokens"),
            ("stop_sequences", "stop"),
        ] {
            let body = json!({"prompt": "a", typo: 5});
            let (param, message) = meant_of(Endpoint::Completions, body);
            assert_eq!(param, typo);
            assert!(message.contains(&format!("`{want}`")), "{typo}: {message}");
        }
    }

    #[test]
    fn the_other_endpoints_field_is_refused_naming_this_ones() {
        let (param, message) = meant_of(
            Endpoint::Completions,
            json!({"prompt": "a", "max_completion_tokens": 5}),
        );
        assert_eq!(param, "max_completion_tokens");
        assert!(message.contains("`max_tokens`"), "{message}");
        let (param, _) = meant_of(
            Endpoint::ChatCompletions,
            json!({"messages": [], "prompt": "a"}),
        );
        assert_eq!(param, "prompt");
        // Chat reads both output bounds.
        check(
            Endpoint::ChatCompletions,
            json!({"messages": [], "max_tokens": 5, "max_completion_tokens": 5}),
        )
        .expect("both are chat's");
    }

    #[test]
    fn unknown_fields_unlike_any_known_one_and_neutral_fields_are_ignored() {
        for name in [
            "store",
            "user",
            "metadata",
            "nvext",
            "kv_transfer_params",
            "my_router_tag",
            "x",
            "top_qr",
        ] {
            for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions] {
                check(endpoint, json!({name: 1})).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }

    #[test]
    fn every_field_the_server_reads_is_itself_and_not_a_misspelling() {
        for name in read().chain(NEUTRAL.iter().copied()) {
            let endpoint = if name == "prompt" {
                Endpoint::Completions
            } else {
                Endpoint::ChatCompletions
            };
            check(endpoint, json!({name: 1})).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn a_misspelt_stream_option_is_refused() {
        let (param, message) = meant_of(
            Endpoint::Completions,
            json!({"prompt": "a", "stream": true, "stream_options": {"include_usgae": true}}),
        );
        assert_eq!(param, "include_usgae");
        assert!(message.contains("`include_usage`"), "{message}");
        check(
            Endpoint::Completions,
            json!({"stream_options": {"include_usage": true, "something_else": 1}}),
        )
        .expect("ignored");
    }
}

//! Parameters of the OpenAI API (and vLLM's extensions) that change the answer but that this
//! server does not implement: asking for one is a 400 naming it, never a silently different
//! answer. A parameter at its neutral value (`n: 1`, `echo: false`, `tools: []`, a penalty
//! of 0 …) is accepted. Fields this server does not know are `unknown.rs`'s.

use serde_json::Value;

use super::error::ApiError;
use super::fields::{shown, Fields};
use super::request::Endpoint;

/// Refused when a non-empty list.
const REFUSED_LISTS: &[&str] = &[
    "tools",
    "functions",
    "stop_token_ids",
    "allowed_token_ids",
    "bad_words",
    "logits_processors",
];
/// Tool calling: refused unless `"none"`.
const TOOL_CHOICES: &[&str] = &["tool_choice", "function_call"];
/// vLLM's extensions and newer OpenAI features that change the answer when set at all.
const REFUSED_WHEN_SET: &[&str] = &[
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "prompt_logprobs",
    "prediction",
    "audio",
    "web_search_options",
    "reasoning_effort",
    "chat_template",
    "chat_template_kwargs",
    "truncate_prompt_tokens",
];
/// Refused when true.
const REFUSED_WHEN_TRUE: &[&str] = &[
    "use_beam_search",
    "include_stop_str_in_output",
    "continue_final_message",
    "return_tokens_as_token_ids",
    "return_token_ids",
];
/// They default to true; false changes the prompt or the text.
const REFUSED_WHEN_FALSE: &[&str] = &[
    "add_generation_prompt",
    "skip_special_tokens",
    "spaces_between_special_tokens",
];
/// Other servers' samplers (TGI's, llama.cpp's, vLLM's beam search): a number, refused
/// unless at the value that turns the sampler off.
const REFUSED_UNLESS_OFF: &[(&str, f64)] = &[
    ("typical_p", 1.0),
    ("tfs_z", 1.0),
    ("top_a", 0.0),
    ("mirostat", 0.0),
    ("dynatemp_range", 0.0),
    ("xtc_probability", 0.0),
    ("dry_multiplier", 0.0),
    ("length_penalty", 1.0),
];
/// The fields read one by one below.
const SINGLES: &[&str] = &[
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "response_format",
    "modalities",
];

/// Every field this module reads (so none of them is taken for a misspelling).
pub fn names() -> impl Iterator<Item = &'static str> {
    [
        SINGLES,
        REFUSED_LISTS,
        TOOL_CHOICES,
        REFUSED_WHEN_SET,
        REFUSED_WHEN_TRUE,
        REFUSED_WHEN_FALSE,
    ]
    .into_iter()
    .flatten()
    .copied()
    .chain(REFUSED_UNLESS_OFF.iter().map(|&(name, _)| name))
}

fn invalid(param: &'static str, message: String) -> ApiError {
    ApiError::invalid("invalid_value", Some(param), message)
}

/// The first parameter of the body that asks for something not implemented here.
pub fn refuse_unsupported(endpoint: Endpoint, f: &Fields) -> Result<(), ApiError> {
    match f.int("n")? {
        Some(n) if n < 1 => return Err(invalid("n", format!("`n` must be ≥ 1, got {n}"))),
        Some(n) if n > 1 => return Err(ApiError::unsupported("n", "`n` > 1")),
        _ => {}
    }
    match f.int("best_of")? {
        Some(b) if b < 1 => {
            return Err(invalid(
                "best_of",
                format!("`best_of` must be ≥ 1, got {b}"),
            ))
        }
        Some(b) if b > 1 => return Err(ApiError::unsupported("best_of", "`best_of` > 1")),
        _ => {}
    }
    // An integer on completions (0 still asks for the chosen token's log-prob), a boolean
    // on chat; `false` asks for none on either.
    let wants_logprobs = match (f.get("logprobs"), endpoint) {
        (None, _) | (Some(Value::Bool(false)), _) => false,
        (Some(Value::Bool(true)), Endpoint::ChatCompletions) => true,
        (Some(_), _) => true,
    };
    if wants_logprobs {
        return Err(ApiError::unsupported("logprobs", "`logprobs`"));
    }
    match f.int("top_logprobs")? {
        Some(k) if k < 0 => {
            return Err(invalid(
                "top_logprobs",
                format!("`top_logprobs` must be ≥ 0, got {k}"),
            ))
        }
        Some(k) if k > 0 => return Err(ApiError::unsupported("top_logprobs", "`top_logprobs`")),
        _ => {}
    }
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "`echo`"));
    }
    if endpoint == Endpoint::Completions && f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "`suffix` (insertion)"));
    }
    if f.object("logit_bias")?.is_some_and(|o| !o.is_empty()) {
        return Err(ApiError::unsupported("logit_bias", "`logit_bias`"));
    }
    penalty(f, "presence_penalty")?;
    penalty(f, "frequency_penalty")?;
    if let Some(p) = f.number("repetition_penalty")? {
        if !(p > 0.0 && p.is_finite()) {
            return Err(invalid(
                "repetition_penalty",
                format!("`repetition_penalty` must be > 0, got {p}"),
            ));
        }
        if p != 1.0 {
            return Err(ApiError::unsupported(
                "repetition_penalty",
                "`repetition_penalty` other than 1",
            ));
        }
    }
    if let Some(p) = f.number("min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(invalid(
                "min_p",
                format!("`min_p` must be in [0, 1], got {p}"),
            ));
        }
        if p != 0.0 {
            return Err(ApiError::unsupported("min_p", "`min_p` other than 0"));
        }
    }
    for &name in REFUSED_LISTS {
        match f.get(name) {
            None => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(Value::Array(_)) => return Err(ApiError::unsupported(name, &format!("`{name}`"))),
            Some(v) => {
                return Err(ApiError::invalid(
                    "invalid_type",
                    Some(name),
                    format!("`{name}` must be a list, got {}", shown(v)),
                ))
            }
        }
    }
    for &name in TOOL_CHOICES {
        match f.get(name) {
            None => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(_) => {
                return Err(ApiError::unsupported(
                    name,
                    &format!("`{name}` (tool calling)"),
                ))
            }
        }
    }
    match f.get("response_format") {
        None => {}
        Some(v) if v.get("type").and_then(Value::as_str) == Some("text") => {}
        Some(_) => {
            return Err(ApiError::unsupported(
                "response_format",
                "`response_format` other than `{\"type\": \"text\"}` (structured output)",
            ))
        }
    }
    for &(name, off) in REFUSED_UNLESS_OFF {
        if f.number(name)?.is_some_and(|v| v != off) {
            return Err(ApiError::unsupported(
                name,
                &format!("`{name}` other than {off}"),
            ));
        }
    }
    for &name in REFUSED_WHEN_SET {
        if f.get(name).is_some() {
            return Err(ApiError::unsupported(name, &format!("`{name}`")));
        }
    }
    for &name in REFUSED_WHEN_TRUE {
        if f.bool(name)? == Some(true) {
            return Err(ApiError::unsupported(name, &format!("`{name}`")));
        }
    }
    for &name in REFUSED_WHEN_FALSE {
        if f.bool(name)? == Some(false) {
            return Err(ApiError::unsupported(name, &format!("`{name}: false`")));
        }
    }
    match f.get("modalities") {
        None => {}
        Some(Value::Array(m)) if m.iter().all(|x| x.as_str() == Some("text")) => {}
        Some(_) => {
            return Err(ApiError::unsupported(
                "modalities",
                "`modalities` other than [\"text\"]",
            ))
        }
    }
    Ok(())
}

/// OpenAI's penalties: in [-2, 2]; only 0 (off) is implemented.
fn penalty(f: &Fields, name: &'static str) -> Result<(), ApiError> {
    if let Some(p) = f.number(name)? {
        if !(-2.0..=2.0).contains(&p) {
            return Err(invalid(
                name,
                format!("`{name}` must be in [-2, 2], got {p}"),
            ));
        }
        if p != 0.0 {
            return Err(ApiError::unsupported(
                name,
                &format!("`{name}` other than 0"),
            ));
        }
    }
    Ok(())
}

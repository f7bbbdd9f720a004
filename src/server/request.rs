//! Parsing and validation of OpenAI request bodies into a [`GenRequest`] plus the response
//! options. Pure (no clock, no I/O) so every rule is unit-tested without HTTP.

use serde::Deserialize;
use serde_json::Value;

use super::engine::GenRequest;
use super::error::ApiError;
use super::tokenize::{ChatTurn, Tokenizer};

/// Which OpenAI endpoint a request came in on; it decides the body and response shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

/// A request ready for the engine, plus how to answer it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub gen: GenRequest,
    /// The model name the client asked for, echoed in responses.
    pub model: Option<String>,
    pub stream: bool,
    /// Send a final `usage` chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Send running `usage` on every chunk (`stream_options.continuous_usage_stats`, vLLM).
    pub continuous_usage: bool,
}

/// Fields we read; everything else in the body is ignored (clients send extras).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Body {
    model: Option<String>,
    prompt: Option<Value>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    min_tokens: Option<i64>,
    ignore_eos: Option<bool>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    arrival_time: Option<f64>,
    n: Option<i64>,
    best_of: Option<i64>,
    /// An integer on completions, a boolean on chat; any request for log-probs is refused.
    logprobs: Option<Value>,
    top_logprobs: Option<i64>,
    echo: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
    continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// Parses and validates one request body. `arrival_header` is the `x-arrival-time` header,
/// used when the body has no `arrival_time`.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    arrival_header: Option<&str>,
    tokenizer: &dyn Tokenizer,
    max_context_tokens: usize,
) -> Result<ParsedRequest, ApiError> {
    let body: Body = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "invalid_json",
            None,
            format!("the request body is not valid JSON for this endpoint: {e}"),
        )
    })?;
    refuse_unsupported(endpoint, &body)?;

    let prompt_tokens = match endpoint {
        Endpoint::Completions => prompt_tokens(body.prompt.as_ref(), tokenizer)?,
        Endpoint::ChatCompletions => {
            let turns = chat_turns(body.messages.as_deref())?;
            let text = tokenizer.try_render_chat(&turns).map_err(|e| {
                ApiError::invalid(
                    "invalid_messages",
                    Some("messages"),
                    format!("the model's chat template refused the messages: {e}"),
                )
            })?;
            tokenizer.encode(&text)
        }
    };
    if prompt_tokens.is_empty() {
        let param = prompt_param(endpoint);
        return Err(ApiError::invalid(
            "empty_prompt",
            Some(param),
            format!("`{param}` is empty"),
        ));
    }

    let requested_max = match endpoint {
        Endpoint::ChatCompletions => body.max_completion_tokens.or(body.max_tokens),
        Endpoint::Completions => body.max_tokens,
    };
    let max_tokens = max_tokens(
        requested_max,
        prompt_tokens.len(),
        max_context_tokens,
        endpoint,
    )?;
    let min_tokens = match body.min_tokens {
        None => 0,
        Some(m) if m < 0 => {
            return Err(ApiError::invalid(
                "invalid_value",
                Some("min_tokens"),
                format!("`min_tokens` must be ≥ 0, got {m}"),
            ))
        }
        Some(m) if m > i64::from(max_tokens) => {
            return Err(ApiError::invalid(
                "invalid_value",
                Some("min_tokens"),
                format!(
                    "`min_tokens` ({m}) must not exceed the maximum output tokens ({max_tokens})"
                ),
            ))
        }
        // ≤ max_tokens, which is a u32.
        Some(m) => m as u32,
    };

    let arrival_unix_s = arrival(body.arrival_time, arrival_header)?;
    let opts = body.stream_options.unwrap_or_default();
    Ok(ParsedRequest {
        endpoint,
        gen: GenRequest {
            prompt_tokens,
            max_tokens,
            min_tokens,
            ignore_eos: body.ignore_eos.unwrap_or(false),
            arrival_unix_s,
            sampling: Default::default(),
        },
        model: body.model,
        stream: body.stream.unwrap_or(false),
        include_usage: opts.include_usage.unwrap_or(false),
        continuous_usage: opts.continuous_usage_stats.unwrap_or(false),
    })
}

fn prompt_param(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "prompt",
        Endpoint::ChatCompletions => "messages",
    }
}

/// Options that would change the response's meaning are refused rather than ignored.
fn refuse_unsupported(endpoint: Endpoint, body: &Body) -> Result<(), ApiError> {
    match body.n {
        Some(n) if n < 1 => {
            return Err(ApiError::invalid(
                "invalid_value",
                Some("n"),
                format!("`n` must be ≥ 1, got {n}"),
            ))
        }
        Some(n) if n > 1 => return Err(ApiError::unsupported("n", "`n` > 1")),
        _ => {}
    }
    if body.best_of.is_some_and(|b| b > 1) {
        return Err(ApiError::unsupported("best_of", "`best_of` > 1"));
    }
    let wants_logprobs = match (&body.logprobs, endpoint) {
        (None | Some(Value::Null), _) => false,
        (Some(Value::Bool(b)), Endpoint::ChatCompletions) => *b,
        (Some(_), _) => true,
    };
    if wants_logprobs || body.top_logprobs.is_some_and(|k| k > 0) {
        return Err(ApiError::unsupported("logprobs", "`logprobs`"));
    }
    if body.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "`echo`"));
    }
    Ok(())
}

const PROMPT_SHAPES: &str =
    "`prompt` must be a string, a list of one string, or a list of token ids";

/// A completions prompt: text, `[text]`, `[ids…]` or `[[ids…]]`.
fn prompt_tokens(prompt: Option<&Value>, tokenizer: &dyn Tokenizer) -> Result<Vec<u32>, ApiError> {
    let bad_shape = || ApiError::invalid("invalid_prompt", Some("prompt"), PROMPT_SHAPES.into());
    let Some(prompt) = prompt.filter(|p| !p.is_null()) else {
        return Err(ApiError::invalid(
            "missing_field",
            Some("prompt"),
            "`prompt` is required".into(),
        ));
    };
    match prompt {
        Value::String(s) => Ok(tokenizer.encode(s)),
        Value::Array(items) => match items.as_slice() {
            [] => Ok(Vec::new()),
            [Value::String(s)] => Ok(tokenizer.encode(s)),
            [Value::Array(ids)] => token_ids(ids).ok_or_else(bad_shape),
            [Value::String(_) | Value::Array(_), ..] => Err(ApiError::unsupported(
                "prompt",
                "a batch of several prompts",
            )),
            ids => token_ids(ids).ok_or_else(bad_shape),
        },
        _ => Err(bad_shape()),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect()
}

/// Chat messages with their text extracted; `content` may be a string, null, or a list of
/// `{"type": "text", "text": …}` parts.
fn chat_turns(messages: Option<&[Message]>) -> Result<Vec<ChatTurn>, ApiError> {
    let Some(messages) = messages else {
        return Err(ApiError::invalid(
            "missing_field",
            Some("messages"),
            "`messages` is required".into(),
        ));
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Ok(ChatTurn {
                role: m.role.clone(),
                content: message_text(i, m.content.as_ref())?,
            })
        })
        .collect()
}

fn message_text(index: usize, content: Option<&Value>) -> Result<String, ApiError> {
    let bad = |what: String| ApiError::invalid("invalid_message", Some("messages"), what);
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(bad(format!(
                            "messages[{index}]: a text part needs a string `text`"
                        )))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::unsupported(
                            "messages",
                            &format!("content of type `{other}` (messages[{index}])"),
                        ))
                    }
                    (None, _) => {
                        return Err(bad(format!(
                            "messages[{index}]: each content part needs a `type`"
                        )))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(bad(format!(
            "messages[{index}].content must be a string or a list of parts"
        ))),
    }
}

/// The output budget: the requested one if it fits the context, else the context's rest
/// (vLLM's default when `max_tokens` is absent).
fn max_tokens(
    requested: Option<i64>,
    prompt_len: usize,
    max_context: usize,
    endpoint: Endpoint,
) -> Result<u32, ApiError> {
    let param = match endpoint {
        Endpoint::Completions => "max_tokens",
        Endpoint::ChatCompletions => "max_completion_tokens",
    };
    let too_long = |what: String| {
        ApiError::invalid(
            "context_length_exceeded",
            Some(prompt_param(endpoint)),
            format!("this model's maximum context length is {max_context} tokens; {what}"),
        )
    };
    if prompt_len >= max_context {
        return Err(too_long(format!(
            "the prompt has {prompt_len} tokens, leaving no room for output"
        )));
    }
    let room = max_context - prompt_len;
    match requested {
        None => Ok(u32::try_from(room).unwrap_or(u32::MAX)),
        Some(m) if m <= 0 => Err(ApiError::invalid(
            "invalid_value",
            Some(param),
            format!("`{param}` must be ≥ 1, got {m}"),
        )),
        Some(m) if usize::try_from(m).map_or(true, |m| m > room) => Err(too_long(format!(
            "the prompt has {prompt_len} tokens and {m} output tokens were requested"
        ))),
        // ≤ room; room itself may exceed u32 only for absurd contexts, which then saturate.
        Some(m) => Ok(u32::try_from(m).unwrap_or(u32::MAX)),
    }
}

fn arrival(body: Option<f64>, header: Option<&str>) -> Result<Option<f64>, ApiError> {
    let (value, param) = match (body, header) {
        (Some(v), _) => (v, "arrival_time"),
        (None, Some(h)) => {
            let v = h.trim().parse::<f64>().map_err(|_| {
                ApiError::invalid(
                    "invalid_value",
                    Some("x-arrival-time"),
                    format!("the x-arrival-time header must be unix seconds, got {h:?}"),
                )
            })?;
            (v, "x-arrival-time")
        }
        (None, None) => return Ok(None),
    };
    if !value.is_finite() || value < 0.0 {
        return Err(ApiError::invalid(
            "invalid_value",
            Some(param),
            format!("`{param}` must be unix seconds (a finite number ≥ 0), got {value}"),
        ));
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tokenize::WordTokenizer;
    use serde_json::json;

    const CTX: usize = 100;

    fn parse(endpoint: Endpoint, body: &str) -> Result<ParsedRequest, ApiError> {
        parse_request(
            endpoint,
            body.as_bytes(),
            None,
            &WordTokenizer::default(),
            CTX,
        )
    }

    fn completion(body: &str) -> Result<ParsedRequest, ApiError> {
        parse(Endpoint::Completions, body)
    }

    fn code(r: Result<ParsedRequest, ApiError>) -> &'static str {
        match r {
            Ok(p) => panic!("expected an error, got {p:?}"),
            Err(e) => e.code,
        }
    }

    proptest::proptest! {
        #[test]
        fn any_body_gets_an_answer_not_a_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions] {
                let _ = parse_request(endpoint, &body, None, &WordTokenizer::default(), CTX);
            }
        }

        #[test]
        fn accepted_requests_fit_the_context(words in 1usize..120, max in proptest::option::of(-5i64..150), min in proptest::option::of(-5i64..150)) {
            let mut body = json!({"prompt": vec!["w"; words].join(" ")});
            if let Some(m) = max { body["max_tokens"] = json!(m); }
            if let Some(m) = min { body["min_tokens"] = json!(m); }
            if let Ok(p) = completion(&body.to_string()) {
                proptest::prop_assert!(p.gen.max_tokens >= 1);
                proptest::prop_assert!(p.gen.min_tokens <= p.gen.max_tokens);
                proptest::prop_assert!(p.gen.prompt_tokens.len() + p.gen.max_tokens as usize <= CTX);
            }
        }
    }

    #[test]
    fn aiperf_completion_body_parses_with_its_options() {
        let p = completion(
            r#"{"prompt":"one two three","model":"m","stream":true,"max_tokens":8,
                "stream_options":{"include_usage":true},"ignore_eos":true,"min_tokens":8,
                "temperature":0.7,"top_p":0.9,"some_extra":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(p.gen.prompt_tokens.len(), 3);
        assert_eq!((p.gen.max_tokens, p.gen.min_tokens), (8, 8));
        assert!(p.gen.ignore_eos && p.stream && p.include_usage && !p.continuous_usage);
        assert_eq!(p.model.as_deref(), Some("m"));
        assert_eq!(p.gen.arrival_unix_s, None);
    }

    #[test]
    fn every_prompt_shape_gives_the_same_tokens() {
        let t = WordTokenizer::default();
        let ids = t.encode("hello there");
        let ids_json = serde_json::to_string(&ids).unwrap();
        for prompt in [
            r#""hello there""#.to_string(),
            r#"["hello there"]"#.to_string(),
            ids_json.clone(),
            format!("[{ids_json}]"),
        ] {
            let p = completion(&format!(r#"{{"prompt":{prompt},"max_tokens":1}}"#)).unwrap();
            assert_eq!(p.gen.prompt_tokens, ids, "prompt {prompt}");
        }
    }

    #[test]
    fn bad_prompts_are_refused_with_their_reason() {
        assert_eq!(code(completion(r#"{"max_tokens":1}"#)), "missing_field");
        assert_eq!(code(completion(r#"{"prompt":null}"#)), "missing_field");
        assert_eq!(code(completion(r#"{"prompt":""}"#)), "empty_prompt");
        assert_eq!(code(completion(r#"{"prompt":[]}"#)), "empty_prompt");
        assert_eq!(code(completion(r#"{"prompt":["a","b"]}"#)), "not_supported");
        assert_eq!(code(completion(r#"{"prompt":[1,-2]}"#)), "invalid_prompt");
        assert_eq!(code(completion(r#"{"prompt":[1,"a"]}"#)), "invalid_prompt");
        assert_eq!(code(completion(r#"{"prompt":7}"#)), "invalid_prompt");
        assert_eq!(code(completion(r#"{"prompt":"x""#)), "invalid_json");
        assert_eq!(
            code(completion(r#"{"prompt":"x","max_tokens":"5"}"#)),
            "invalid_json"
        );
    }

    #[test]
    fn output_budget_rules() {
        let p = completion(r#"{"prompt":"a b c"}"#).unwrap();
        assert_eq!(
            p.gen.max_tokens,
            (CTX - 3) as u32,
            "absent = the context's rest"
        );
        assert_eq!(
            code(completion(r#"{"prompt":"a","max_tokens":0}"#)),
            "invalid_value"
        );
        assert_eq!(
            code(completion(r#"{"prompt":"a","max_tokens":-1}"#)),
            "invalid_value"
        );
        assert_eq!(
            code(completion(r#"{"prompt":"a b","max_tokens":99}"#)),
            "context_length_exceeded"
        );
        assert!(completion(r#"{"prompt":"a b","max_tokens":98}"#).is_ok());
        let long = vec!["w"; CTX].join(" ");
        assert_eq!(
            code(completion(&format!(
                r#"{{"prompt":"{long}","max_tokens":1}}"#
            ))),
            "context_length_exceeded"
        );
        assert_eq!(
            code(completion(
                r#"{"prompt":"a","max_tokens":4,"min_tokens":5}"#
            )),
            "invalid_value"
        );
        assert_eq!(
            code(completion(
                r#"{"prompt":"a","max_tokens":4,"min_tokens":-1}"#
            )),
            "invalid_value"
        );
    }

    #[test]
    fn options_that_change_the_answer_are_refused() {
        for body in [
            r#"{"prompt":"a","n":2}"#,
            r#"{"prompt":"a","best_of":3}"#,
            r#"{"prompt":"a","logprobs":1}"#,
            r#"{"prompt":"a","logprobs":0}"#,
            r#"{"prompt":"a","echo":true}"#,
        ] {
            assert_eq!(code(completion(body)), "not_supported", "{body}");
        }
        assert_eq!(code(completion(r#"{"prompt":"a","n":0}"#)), "invalid_value");
        assert!(
            completion(r#"{"prompt":"a","n":1,"best_of":1,"logprobs":null,"echo":false}"#).is_ok()
        );
        let chat = |b: &str| parse(Endpoint::ChatCompletions, b);
        assert_eq!(
            code(chat(
                r#"{"messages":[{"role":"user","content":"a"}],"logprobs":true}"#
            )),
            "not_supported"
        );
        assert!(chat(r#"{"messages":[{"role":"user","content":"a"}],"logprobs":false}"#).is_ok());
    }

    #[test]
    fn chat_renders_messages_and_prefers_max_completion_tokens() {
        let p = parse(
            Endpoint::ChatCompletions,
            r#"{"messages":[{"role":"system","content":"Be brief."},
                {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
                {"role":"assistant","content":null}],
                "max_tokens":3,"max_completion_tokens":5}"#,
        )
        .unwrap();
        let t = WordTokenizer::default();
        let expected = t.encode(&t.render_chat(&[
            ChatTurn {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatTurn {
                role: "user".into(),
                content: "Hi there".into(),
            },
            ChatTurn {
                role: "assistant".into(),
                content: String::new(),
            },
        ]));
        assert_eq!(p.gen.prompt_tokens, expected);
        assert_eq!(p.gen.max_tokens, 5);
    }

    #[test]
    fn bad_chat_messages_are_refused() {
        let chat = |b: &str| parse(Endpoint::ChatCompletions, b);
        assert_eq!(code(chat(r#"{"prompt":"a"}"#)), "missing_field");
        assert_eq!(
            code(chat(r#"{"messages":[{"content":"a"}]}"#)),
            "invalid_json"
        );
        assert_eq!(
            code(chat(
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#
            )),
            "not_supported"
        );
        assert_eq!(
            code(chat(r#"{"messages":[{"role":"user","content":5}]}"#)),
            "invalid_message"
        );
    }

    #[test]
    fn arrival_comes_from_the_body_then_the_header() {
        let t = WordTokenizer::default();
        let with = |body: &str, header: Option<&str>| {
            parse_request(Endpoint::Completions, body.as_bytes(), header, &t, CTX)
        };
        let body = r#"{"prompt":"a","arrival_time":1700000000.5}"#;
        assert_eq!(
            with(body, Some("5")).unwrap().gen.arrival_unix_s,
            Some(1_700_000_000.5)
        );
        assert_eq!(
            with(r#"{"prompt":"a"}"#, Some(" 1700000001.25 "))
                .unwrap()
                .gen
                .arrival_unix_s,
            Some(1_700_000_001.25)
        );
        assert_eq!(
            code(with(r#"{"prompt":"a"}"#, Some("soon"))),
            "invalid_value"
        );
        assert_eq!(
            code(with(r#"{"prompt":"a","arrival_time":-1}"#, None)),
            "invalid_value"
        );
    }
}

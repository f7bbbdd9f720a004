//! Parsing and validation of OpenAI request bodies into a [`GenRequest`] plus the response
//! options (SPEC §7). Every parameter is implemented, range-checked, or refused with a 400
//! naming it; an unknown field is ignored unless it looks like one of those (`unknown.rs`).
//! Pure (the receive time comes in) so every rule is unit-tested without HTTP.

use serde_json::Value;

use super::arrival::ArrivalPolicy;
use super::chat::chat_turns;
use super::engine::GenRequest;
use super::error::ApiError;
use super::fields::Fields;
use super::models::ModelNames;
use super::params::{sampling, stop_strings};
use super::tokenize::Tokenizer;
use super::unknown::refuse_misnamed;
use super::unsupported::refuse_unsupported;

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
    /// The served model's id (the request may have named it by an alias).
    pub model: String,
    pub stream: bool,
    /// Send a final `usage` chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Send running `usage` on every chunk (`stream_options.continuous_usage_stats`, vLLM).
    pub continuous_usage: bool,
}

/// What parsing needs besides the body.
pub struct ParseContext<'a> {
    pub tokenizer: &'a dyn Tokenizer,
    /// Longest prompt + output.
    pub max_context_tokens: usize,
    /// Output bound when the request sets none (`server.default_max_tokens`).
    pub default_max_tokens: u32,
    pub models: &'a ModelNames,
    pub arrival: ArrivalPolicy,
    /// When this server received the request (unix seconds).
    pub received_unix_s: f64,
}

/// Parses and validates one request body. `arrival_header` is the `x-arrival-time` header.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    arrival_header: Option<&str>,
    ctx: &ParseContext,
) -> Result<ParsedRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "invalid_json",
            None,
            format!("the request body is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(map) = &value else {
        return Err(ApiError::invalid(
            "invalid_json",
            None,
            "the request body must be a JSON object".into(),
        ));
    };
    let f = Fields::new(map);
    let model = ctx.models.resolve(f.string("model")?)?.to_owned();
    refuse_unsupported(endpoint, &f)?;
    refuse_misnamed(endpoint, map)?;

    let stream = f.bool("stream")?.unwrap_or(false);
    let (include_usage, continuous_usage) = match f.object("stream_options")? {
        None => (false, false),
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "invalid_value",
                Some("stream_options"),
                "`stream_options` is only allowed with `stream: true`".into(),
            ))
        }
        Some(o) => (
            o.bool("include_usage")?.unwrap_or(false),
            o.bool("continuous_usage_stats")?.unwrap_or(false),
        ),
    };

    let prompt_tokens = match endpoint {
        Endpoint::Completions => prompt_tokens(f.get("prompt"), ctx.tokenizer)?,
        Endpoint::ChatCompletions => {
            let turns = chat_turns(f.get("messages"))?;
            let text = ctx.tokenizer.try_render_chat(&turns).map_err(|e| {
                ApiError::invalid(
                    "invalid_message",
                    Some("messages"),
                    format!("the model's chat template refused the messages: {e}"),
                )
            })?;
            ctx.tokenizer.encode(&text)
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
        // Both are type-checked; the newer name wins when both are given, as at OpenAI.
        Endpoint::ChatCompletions => {
            let legacy = f.int("max_tokens")?;
            match f.int("max_completion_tokens")? {
                Some(m) => Some((m, "max_completion_tokens")),
                None => legacy.map(|m| (m, "max_tokens")),
            }
        }
        Endpoint::Completions => f.int("max_tokens")?.map(|m| (m, "max_tokens")),
    };
    let max_tokens = max_tokens(requested_max, prompt_tokens.len(), endpoint, ctx)?;
    let min_tokens = match f.int("min_tokens")? {
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

    let arrival_unix_s =
        ctx.arrival
            .resolve(f.get("arrival_time"), arrival_header, ctx.received_unix_s)?;
    Ok(ParsedRequest {
        endpoint,
        gen: GenRequest {
            prompt_tokens,
            max_tokens,
            min_tokens,
            ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
            arrival_unix_s,
            sampling: sampling(&f)?,
            stop: stop_strings(&f)?,
        },
        model,
        stream,
        include_usage,
        continuous_usage,
    })
}

fn prompt_param(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "prompt",
        Endpoint::ChatCompletions => "messages",
    }
}

const PROMPT_SHAPES: &str =
    "`prompt` must be a string, a list of one string, or a list of token ids";

/// A completions prompt: text, `[text]`, `[ids…]` or `[[ids…]]`.
fn prompt_tokens(prompt: Option<&Value>, tokenizer: &dyn Tokenizer) -> Result<Vec<u32>, ApiError> {
    let bad_shape = || ApiError::invalid("invalid_prompt", Some("prompt"), PROMPT_SHAPES.into());
    let Some(prompt) = prompt else {
        return Err(ApiError::invalid(
            "missing_field",
            Some("prompt"),
            "`prompt` is required".into(),
        ));
    };
    let ids = match prompt {
        Value::String(s) => return Ok(tokenizer.encode(s)),
        Value::Array(items) => match items.as_slice() {
            [] => return Ok(Vec::new()),
            [Value::String(s)] => return Ok(tokenizer.encode(s)),
            [Value::Array(ids)] => token_ids(ids).ok_or_else(bad_shape)?,
            [Value::String(_) | Value::Array(_), ..] => {
                return Err(ApiError::unsupported(
                    "prompt",
                    "a batch of several prompts",
                ))
            }
            ids => token_ids(ids).ok_or_else(bad_shape)?,
        },
        _ => return Err(bad_shape()),
    };
    if let Some(vocab) = tokenizer.vocab_size() {
        if let Some(id) = ids.iter().find(|&&id| id >= vocab) {
            return Err(ApiError::invalid(
                "invalid_prompt",
                Some("prompt"),
                format!("token id {id} is outside the vocabulary (ids 0..{vocab})"),
            ));
        }
    }
    Ok(ids)
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect()
}

/// The output budget: the requested one if it fits the context; without one,
/// `server.default_max_tokens` capped by the context's rest.
fn max_tokens(
    requested: Option<(i64, &'static str)>,
    prompt_len: usize,
    endpoint: Endpoint,
    ctx: &ParseContext,
) -> Result<u32, ApiError> {
    let max_context = ctx.max_context_tokens;
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
    let room_u32 = u32::try_from(room).unwrap_or(u32::MAX);
    match requested {
        None => Ok(ctx.default_max_tokens.clamp(1, room_u32)),
        Some((m, param)) if m <= 0 => Err(ApiError::invalid(
            "invalid_value",
            Some(param),
            format!("`{param}` must be ≥ 1, got {m}"),
        )),
        Some((m, _)) if usize::try_from(m).map_or(true, |m| m > room) => Err(too_long(format!(
            "the prompt has {prompt_len} tokens and {m} output tokens were requested"
        ))),
        // ≤ room; room itself may exceed u32 only for absurd contexts, which then saturate.
        Some((m, _)) => Ok(u32::try_from(m).unwrap_or(u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tokenize::{ChatTurn, WordTokenizer};
    use serde_json::json;

    const CTX: usize = 100;
    const NOW: f64 = 1_700_000_000.0;

    fn names() -> ModelNames {
        ModelNames::new("m").with_aliases(vec!["alias".into()])
    }

    fn with(
        endpoint: Endpoint,
        body: &str,
        header: Option<&str>,
        arrival: ArrivalPolicy,
    ) -> Result<ParsedRequest, ApiError> {
        let models = names();
        let ctx = ParseContext {
            tokenizer: &WordTokenizer::default(),
            max_context_tokens: CTX,
            default_max_tokens: 40,
            models: &models,
            arrival,
            received_unix_s: NOW,
        };
        parse_request(endpoint, body.as_bytes(), header, &ctx)
    }

    fn parse(endpoint: Endpoint, body: &str) -> Result<ParsedRequest, ApiError> {
        with(endpoint, body, None, ArrivalPolicy::default())
    }

    fn completion(body: &str) -> Result<ParsedRequest, ApiError> {
        parse(Endpoint::Completions, body)
    }

    fn chat(body: &str) -> Result<ParsedRequest, ApiError> {
        parse(Endpoint::ChatCompletions, body)
    }

    fn code(r: Result<ParsedRequest, ApiError>) -> &'static str {
        match r {
            Ok(p) => panic!("expected an error, got {p:?}"),
            Err(e) => e.code,
        }
    }

    fn param(r: Result<ParsedRequest, ApiError>) -> Option<String> {
        match r {
            Ok(p) => panic!("expected an error, got {p:?}"),
            Err(e) => e.param().map(str::to_owned),
        }
    }

    proptest::proptest! {
        #[test]
        fn any_body_gets_an_answer_not_a_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let models = names();
            let ctx = ParseContext {
                tokenizer: &WordTokenizer::default(),
                max_context_tokens: CTX,
                default_max_tokens: 40,
                models: &models,
                arrival: ArrivalPolicy { trust: true, horizon_s: 10.0 },
                received_unix_s: NOW,
            };
            for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions] {
                let _ = parse_request(endpoint, &body, Some("x"), &ctx);
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
        assert_eq!(p.model, "m");
        assert_eq!(
            (p.gen.sampling.temperature, p.gen.sampling.top_p),
            (0.7, 0.9)
        );
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
        assert_eq!(code(completion(r#"[1]"#)), "invalid_json");
        assert_eq!(
            param(completion(r#"{"prompt":"x","max_tokens":"5"}"#)),
            Some("max_tokens".into())
        );
    }

    #[test]
    fn token_ids_outside_the_vocabulary_are_refused() {
        assert_eq!(
            code(completion(r#"{"prompt":[1,31999,32000],"max_tokens":1}"#)),
            "invalid_prompt"
        );
        assert!(completion(r#"{"prompt":[0,31999],"max_tokens":1}"#).is_ok());
    }

    #[test]
    fn output_budget_rules() {
        let p = completion(r#"{"prompt":"a b c"}"#).unwrap();
        assert_eq!(p.gen.max_tokens, 40, "absent = server.default_max_tokens");
        let long = vec!["w"; CTX - 10].join(" ");
        let p = completion(&format!(r#"{{"prompt":"{long}"}}"#)).unwrap();
        assert_eq!(p.gen.max_tokens, 10, "… capped by the context's rest");
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
    fn parameters_we_do_not_implement_are_refused_by_name() {
        for (body, name) in [
            (r#"{"prompt":"a","n":2}"#, "n"),
            (r#"{"prompt":"a","best_of":3}"#, "best_of"),
            (r#"{"prompt":"a","logprobs":1}"#, "logprobs"),
            (r#"{"prompt":"a","logprobs":0}"#, "logprobs"),
            (r#"{"prompt":"a","top_logprobs":2}"#, "top_logprobs"),
            (r#"{"prompt":"a","echo":true}"#, "echo"),
            (r#"{"prompt":"a","suffix":"end"}"#, "suffix"),
            (
                r#"{"prompt":"a","logit_bias":{"50256":-100}}"#,
                "logit_bias",
            ),
            (
                r#"{"prompt":"a","frequency_penalty":0.5}"#,
                "frequency_penalty",
            ),
            (
                r#"{"prompt":"a","presence_penalty":-1}"#,
                "presence_penalty",
            ),
            (
                r#"{"prompt":"a","repetition_penalty":1.1}"#,
                "repetition_penalty",
            ),
            (r#"{"prompt":"a","min_p":0.1}"#, "min_p"),
            (r#"{"prompt":"a","tools":[{"type":"function"}]}"#, "tools"),
            (r#"{"prompt":"a","tool_choice":"auto"}"#, "tool_choice"),
            (r#"{"prompt":"a","functions":[{"name":"f"}]}"#, "functions"),
            (
                r#"{"prompt":"a","response_format":{"type":"json_object"}}"#,
                "response_format",
            ),
            (r#"{"prompt":"a","guided_json":{}}"#, "guided_json"),
            (r#"{"prompt":"a","stop_token_ids":[2]}"#, "stop_token_ids"),
            (
                r#"{"prompt":"a","use_beam_search":true}"#,
                "use_beam_search",
            ),
            (
                r#"{"prompt":"a","reasoning_effort":"high"}"#,
                "reasoning_effort",
            ),
            (
                r#"{"prompt":"a","allowed_token_ids":[1]}"#,
                "allowed_token_ids",
            ),
            (r#"{"prompt":"a","bad_words":["x"]}"#, "bad_words"),
            (
                r#"{"prompt":"a","truncate_prompt_tokens":1}"#,
                "truncate_prompt_tokens",
            ),
            (
                r#"{"prompt":"a","return_tokens_as_token_ids":true}"#,
                "return_tokens_as_token_ids",
            ),
            (
                r#"{"prompt":"a","skip_special_tokens":false}"#,
                "skip_special_tokens",
            ),
            (r#"{"prompt":"a","typical_p":0.2}"#, "typical_p"),
            (r#"{"prompt":"a","mirostat":2}"#, "mirostat"),
            (r#"{"prompt":"a","top_a":0.1}"#, "top_a"),
        ] {
            let r = completion(body);
            let e = r.expect_err(body);
            assert_eq!((e.code, e.param()), ("not_supported", Some(name)), "{body}");
            assert!(e.message.contains(name), "{body}: {}", e.message);
        }
        assert_eq!(code(completion(r#"{"prompt":"a","n":0}"#)), "invalid_value");
        assert_eq!(
            param(completion(r#"{"prompt":"a","frequency_penalty":50}"#)),
            Some("frequency_penalty".into())
        );
        assert!(completion(
            r#"{"prompt":"a","n":1,"best_of":1,"logprobs":false,"echo":false,"suffix":"",
                "tools":[],"tool_choice":"none","response_format":{"type":"text"},
                "frequency_penalty":0,"presence_penalty":0.0,"logit_bias":{},
                "user":"u","metadata":{"k":"v"},"unknown_extra":1,"allowed_token_ids":[],
                "skip_special_tokens":true,"return_tokens_as_token_ids":false,
                "typical_p":1.0,"mirostat":0,"length_penalty":1}"#
        )
        .is_ok());
        assert_eq!(
            code(chat(
                r#"{"messages":[{"role":"user","content":"a"}],"logprobs":true}"#
            )),
            "not_supported"
        );
        assert!(chat(r#"{"messages":[{"role":"user","content":"a"}],"logprobs":false}"#).is_ok());
    }

    #[test]
    fn sampling_and_stop_are_carried() {
        let p =
            completion(r#"{"prompt":"a","temperature":0,"top_k":5,"seed":9,"stop":["x","yz"]}"#)
                .unwrap();
        assert!(p.gen.sampling.is_greedy());
        assert_eq!((p.gen.sampling.top_k, p.gen.sampling.seed), (5, Some(9)));
        assert_eq!(p.gen.stop, ["x", "yz"]);
        let p = completion(r#"{"prompt":"a"}"#).unwrap();
        assert_eq!(p.gen.sampling.temperature, 1.0, "OpenAI's default");
        assert_eq!(
            param(completion(r#"{"prompt":"a","stop":5}"#)),
            Some("stop".into())
        );
        assert_eq!(
            param(completion(r#"{"prompt":"a","seed":"abc"}"#)),
            Some("seed".into())
        );
        assert_eq!(
            param(completion(r#"{"prompt":"a","top_p":7}"#)),
            Some("top_p".into())
        );
    }

    #[test]
    fn stream_options_need_stream() {
        assert_eq!(
            param(completion(
                r#"{"prompt":"a","stream_options":{"include_usage":true}}"#
            )),
            Some("stream_options".into())
        );
        assert!(completion(r#"{"prompt":"a","stream":false,"stream_options":null}"#).is_ok());
    }

    #[test]
    fn the_model_must_be_the_served_one_or_an_alias() {
        assert_eq!(
            completion(r#"{"prompt":"a","model":"alias"}"#)
                .unwrap()
                .model,
            "m"
        );
        assert_eq!(completion(r#"{"prompt":"a"}"#).unwrap().model, "m");
        let e = completion(r#"{"prompt":"a","model":"gpt-4"}"#).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (404, "model_not_found"));
    }

    #[test]
    fn chat_renders_messages_and_prefers_max_completion_tokens() {
        let p = chat(
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
    fn a_max_tokens_beside_max_completion_tokens_is_still_type_checked() {
        let e = chat(
            r#"{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":3,"max_tokens":"x"}"#,
        )
        .unwrap_err();
        assert_eq!(e.param(), Some("max_tokens"));
    }

    #[test]
    fn bad_chat_messages_are_refused() {
        assert_eq!(code(chat(r#"{"max_tokens":5}"#)), "missing_field");
        // The completions field on chat names the one meant.
        assert_eq!(code(chat(r#"{"prompt":"a"}"#)), "unknown_parameter");
        assert_eq!(code(chat(r#"{"messages":[]}"#)), "invalid_message");
        assert_eq!(
            code(chat(r#"{"messages":[{"role":"wizard","content":"a"}]}"#)),
            "invalid_message"
        );
        assert_eq!(
            code(chat(r#"{"messages":[{"content":"a"}]}"#)),
            "invalid_message"
        );
        assert_eq!(
            code(chat(
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#
            )),
            "not_supported"
        );
    }

    #[test]
    fn arrival_stamps_count_only_when_trusted() {
        let body = format!(r#"{{"prompt":"a","arrival_time":{}}}"#, NOW - 5.0);
        let untrusted = with(
            Endpoint::Completions,
            &body,
            Some("1"),
            ArrivalPolicy::default(),
        );
        assert_eq!(untrusted.unwrap().gen.arrival_unix_s, None);
        let trusted = ArrivalPolicy {
            trust: true,
            horizon_s: 60.0,
        };
        let p = with(Endpoint::Completions, &body, None, trusted).unwrap();
        assert_eq!(p.gen.arrival_unix_s, Some(NOW - 5.0));
        let forged = with(
            Endpoint::Completions,
            r#"{"prompt":"a","arrival_time":1.0}"#,
            None,
            trusted,
        );
        assert_eq!(param(forged), Some("arrival_time".into()));
    }
}

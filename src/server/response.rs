//! OpenAI response bodies: full responses and streaming chunks, for completions and chat.

use serde_json::{json, Value};

use super::request::Endpoint;

/// What every response and chunk of one request shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    pub fn new(endpoint: Endpoint, engine_id: u64, created: u64, model: String) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::ChatCompletions => "chatcmpl",
        };
        ResponseMeta {
            endpoint,
            id: format!("{prefix}-{engine_id}"),
            created,
            model,
        }
    }

    fn object(&self, streaming: bool) -> &'static str {
        match (self.endpoint, streaming) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::ChatCompletions, false) => "chat.completion",
            (Endpoint::ChatCompletions, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, streaming: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(streaming),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The whole answer of a non-streaming request.
    pub fn full(&self, text: &str, finish_reason: &str, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason,
            }),
            Endpoint::ChatCompletions => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        let mut body = self.envelope(false, json!([choice]));
        body["usage"] = usage.to_json();
        body
    }

    /// One streamed piece. `first` marks the first chat chunk, which carries the role; it also
    /// carries text so clients that time the first non-empty chunk measure the real TTFT.
    pub fn chunk(
        &self,
        text: &str,
        first: bool,
        finish_reason: Option<&str>,
        usage: Option<Usage>,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason,
            }),
            Endpoint::ChatCompletions => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if !text.is_empty() || first {
                    delta.insert("content".into(), json!(text));
                }
                json!({
                    "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason,
                })
            }
        };
        let mut body = self.envelope(true, json!([choice]));
        if let Some(usage) = usage {
            body["usage"] = usage.to_json();
        }
        body
    }

    /// The final chunk of `stream_options.include_usage`: no choices, only usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut body = self.envelope(true, json!([]));
        body["usage"] = usage.to_json();
        body
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(endpoint: Endpoint) -> ResponseMeta {
        ResponseMeta::new(endpoint, 9, 1_700_000_000, "m".into())
    }

    const USAGE: Usage = Usage {
        prompt_tokens: 3,
        completion_tokens: 2,
    };

    #[test]
    fn full_completion_has_text_finish_reason_and_usage() {
        let v = meta(Endpoint::Completions).full(" a b", "length", USAGE);
        assert_eq!(v["id"], "cmpl-9");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], " a b");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["total_tokens"], 5);
    }

    #[test]
    fn full_chat_answer_is_an_assistant_message() {
        let v = meta(Endpoint::ChatCompletions).full(" a", "stop", USAGE);
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], " a");
    }

    #[test]
    fn chat_chunks_carry_role_first_and_an_empty_delta_at_the_end() {
        let m = meta(Endpoint::ChatCompletions);
        let first = m.chunk(" a", true, None, None);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first["choices"][0]["delta"]["content"], " a");
        assert!(first.get("usage").is_none());
        let last = m.chunk("", false, Some("length"), Some(USAGE));
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn usage_chunk_has_no_choices() {
        let v = meta(Endpoint::Completions).usage_chunk(USAGE);
        assert_eq!(v["choices"], json!([]));
        assert_eq!(v["usage"]["prompt_tokens"], 3);
    }
}

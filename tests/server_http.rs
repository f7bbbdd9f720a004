//! The OpenAI API over loopback against the mock engine: response shapes and request errors.

mod server_support;

use genslot::server::engine::Engine;
use genslot::server::mock::MockConfig;
use genslot::server::tokenize::{Tokenizer, WordTokenizer};
use serde_json::{json, Value};
use server_support::*;

#[tokio::test]
async fn streaming_completion_sends_tokens_then_usage_then_done() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"model": "genslot-test", "prompt": prompt_of(12), "max_tokens": 6, "stream": true,
                    "ignore_eos": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = chunks(&r.text().await.unwrap());
    let (usage, token_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18})
    );
    let text: String = token_chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        count_tokens(&text),
        6,
        "text {text:?} re-tokenizes to usage"
    );
    let reasons: Vec<&Value> = token_chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .collect();
    assert_eq!(reasons.last().copied(), Some(&json!("length")));
    assert!(reasons[..reasons.len() - 1].iter().all(|r| r.is_null()));
    for c in &chunks {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["model"], "genslot-test");
        assert_eq!(c["id"], chunks[0]["id"]);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn streaming_chat_sends_role_then_deltas_then_usage_then_done() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hello there"}],
                    "max_completion_tokens": 5, "stream": true, "ignore_eos": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let chunks = chunks(&r.text().await.unwrap());
    let (usage, deltas) = chunks.split_last().unwrap();
    assert_eq!(deltas[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = deltas
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(count_tokens(&text), 5);
    assert!(deltas
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(
        deltas.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let t = WordTokenizer::default();
    let rendered = t.render_chat(&[genslot::server::tokenize::ChatTurn {
        role: "user".into(),
        content: "Hello there".into(),
    }]);
    assert_eq!(usage["usage"]["prompt_tokens"], t.encode(&rendered).len());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_include_usage_the_stream_has_no_usage_chunk() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b", "max_tokens": 3, "stream": true}),
        )
        .await;
    let chunks = chunks(&r.text().await.unwrap());
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert!(chunks
        .iter()
        .all(|c| c["choices"].as_array().unwrap().len() == 1));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn continuous_usage_puts_running_counts_on_every_chunk() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a b", "max_tokens": 4, "stream": true,
                    "stream_options": {"continuous_usage_stats": true}}),
        )
        .await;
    let chunks = chunks(&r.text().await.unwrap());
    let counts: Vec<u64> = chunks
        .iter()
        .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&4));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn non_streaming_completion_and_chat_return_openai_json_with_usage() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt_of(7), "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["model"], "genslot-test",
        "the served name when none is asked"
    );
    assert_eq!(count_tokens(v["choices"][0]["text"].as_str().unwrap()), 4);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11})
    );

    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        count_tokens(v["choices"][0]["message"]["content"].as_str().unwrap()),
        3
    );
    assert_eq!(v["usage"]["completion_tokens"], 3);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn eos_finishes_with_stop_unless_ignore_eos() {
    let s = Server::start(MockConfig {
        eos_after: Some(2),
        ..fast()
    })
    .await;
    let v: Value = s
        .post("/v1/completions", &json!({"prompt": "a", "max_tokens": 9}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 9, "ignore_eos": true}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 9);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_400_with_openai_error_json() {
    let s = Server::start(MockConfig {
        max_context_tokens: 50,
        ..fast()
    })
    .await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/v1/completions", json!({"max_tokens": 3}), "missing_field"),
        (
            "/v1/chat/completions",
            json!({"max_tokens": 3}),
            "missing_field",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 0}),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": -5}),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt_of(50), "max_tokens": 1}),
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt_of(40), "max_tokens": 20}),
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 3, "min_tokens": 4}),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "n": 2}),
            "not_supported",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 2}),
            "not_supported",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": "three"}),
            "invalid_type",
        ),
    ];
    for (path, body, code) in cases {
        let r = s.post(path, &body).await;
        assert_openai_error(r, 400, code).await;
    }
    for raw in ["{\"prompt\": \"a\"", "not json", ""] {
        let r = s.post_raw("/v1/completions", raw).await;
        assert_openai_error(r, 400, "invalid_json").await;
    }
    // No content type at all is still read as JSON, never axum's plain-text 415.
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .body("{\"prompt\": \"a\", \"max_tokens\": 1}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_openai_error(s.get("/v1/nothing").await, 404, "not_found").await;
    assert_eq!(
        s.engine.submitted().len(),
        1,
        "only the valid request reached the engine"
    );
    s.shutdown().await.unwrap();
}

/// A body past 64 KiB is parsed on the blocking pool instead of the async worker; what the
/// client gets is the same, an answer or an error.
#[tokio::test]
async fn a_large_prompt_is_served_and_refused_the_same_as_a_small_one() {
    let cfg = MockConfig {
        max_context_tokens: 30_000,
        ..fast()
    };
    let s = Server::start(cfg).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt_of(20_000), "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 20_000);
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt_of(40_000), "max_tokens": 2}),
        )
        .await;
    assert_openai_error(r, 400, "context_length_exceeded").await;
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn oversized_bodies_get_413_with_error_json() {
    let s = Server::start_with(fast(), |app| app.with_max_body_bytes(1024)).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt_of(1000), "max_tokens": 1}),
        )
        .await;
    assert_openai_error(r, 413, "invalid_body").await;
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn models_lists_the_served_model_with_its_context() {
    let s = Server::start(fast()).await;
    let v: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "genslot-test");
    assert_eq!(v["data"][0]["max_model_len"], s.engine.max_context_tokens());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_model_is_retrieved_by_its_id_and_any_other_is_not_found() {
    let s = Server::start_with(fast(), |app| {
        app.with_model_aliases(vec!["org/alias".into()])
    })
    .await;
    for name in ["genslot-test", "org/alias"] {
        let r = s.get(&format!("/v1/models/{name}")).await;
        assert_eq!(r.status(), 200, "{name}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (v["id"].as_str(), v["object"].as_str()),
            (Some("genslot-test"), Some("model"))
        );
    }
    assert_openai_error(s.get("/v1/models/gpt-4").await, 404, "model_not_found").await;
    s.shutdown().await.unwrap();
}

//! Request validation over HTTP against the mock engine (SPEC §7): every parameter that
//! changes the answer is implemented, range-checked, or a 400 naming it; chat messages are
//! validated; a misspelt field is a 400 naming the one meant; an unknown model is a 404;
//! every route answers errors in OpenAI's JSON shape.

mod server_support;

use genslot::server::mock::MockConfig;
use serde_json::{json, Value};
use server_support::*;

async fn error_of(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v: Value = r.json().await.expect("error body is JSON");
    v["error"].clone()
}

#[tokio::test]
async fn out_of_range_sampling_parameters_are_400s_naming_the_parameter() {
    let s = Server::start(fast()).await;
    for (extra, param) in [
        (json!({"temperature": -1}), "temperature"),
        (json!({"temperature": 5}), "temperature"),
        (json!({"top_p": 7}), "top_p"),
        (json!({"top_k": -5}), "top_k"),
        (json!({"frequency_penalty": 50}), "frequency_penalty"),
        (json!({"seed": "abc"}), "seed"),
        (json!({"stop": 5}), "stop"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"min_tokens": -1}), "min_tokens"),
    ] {
        let mut body = json!({"prompt": "a", "max_tokens": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e = error_of(s.post("/v1/completions", &body).await, 400).await;
        assert_eq!(e["param"], param, "{body}: {e}");
        assert_eq!(e["type"], "invalid_request_error");
    }
    assert!(s.engine.submitted().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn parameters_that_change_the_answer_but_are_not_implemented_are_400s() {
    let s = Server::start(fast()).await;
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": "a", "suffix": "!"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "best_of": 2}),
            "best_of",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "echo": true}),
            "echo",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logit_bias": {"1": 5}}),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}],
                   "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}],
                   "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 3}),
            "top_logprobs",
        ),
    ] {
        let e = error_of(s.post(path, &body).await, 400).await;
        assert_eq!(
            (e["code"].as_str(), e["param"].as_str()),
            (Some("not_supported"), Some(param)),
            "{body}"
        );
    }
    assert!(s.engine.submitted().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn sampling_parameters_and_stop_reach_the_engine() {
    let s = Server::start(fast()).await;
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 2, "temperature": 0, "top_p": 0.5,
                    "top_k": 3, "seed": 11, "stop": "\n"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = s
        .post("/v1/completions", &json!({"prompt": "a", "max_tokens": 2}))
        .await;
    assert_eq!(r.status(), 200);
    let sent = s.engine.submitted();
    let p = sent[0].sampling;
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.seed),
        (0.0, 0.5, 3, Some(11))
    );
    assert_eq!(sent[0].stop, ["\n"]);
    assert_eq!(
        sent[1].sampling.temperature, 1.0,
        "absent temperature is OpenAI's 1"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn chat_messages_are_validated() {
    let s = Server::start(fast()).await;
    for messages in [
        json!([]),
        json!([{"role": "wizard", "content": "hi"}]),
        json!([{"role": "user"}]),
        json!([{"role": "user", "content": 7}]),
        json!("hi"),
    ] {
        let e = error_of(
            s.post(
                "/v1/chat/completions",
                &json!({"messages": messages, "max_tokens": 2}),
            )
            .await,
            400,
        )
        .await;
        assert_eq!(e["param"], "messages", "{messages}: {e}");
    }
    assert!(s.engine.submitted().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn stream_options_without_stream_are_refused() {
    let s = Server::start(fast()).await;
    let e = error_of(
        s.post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 2, "stream_options": {"include_usage": true}}),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(e["param"], "stream_options");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_misspelt_or_misplaced_field_is_a_400_naming_it_and_other_unknown_fields_pass() {
    let s = Server::start(fast()).await;
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": "a", "max_token": 2}),
            "max_token",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_completion_tokens": 2}),
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "temprature": 0}),
            "temprature",
        ),
    ] {
        let e = error_of(s.post(path, &body).await, 400).await;
        assert_eq!(
            (e["code"].as_str(), e["param"].as_str()),
            (Some("unknown_parameter"), Some(param)),
            "{body}: {e}"
        );
    }
    assert!(s.engine.submitted().is_empty());
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 2, "nvext": {"x": 1}, "store": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unknown_model_is_404_and_aliases_resolve_to_the_served_id() {
    let s = Server::start_with(fast(), |app| app.with_model_aliases(vec!["genslot".into()])).await;
    let e = error_of(
        s.post(
            "/v1/completions",
            &json!({"model": "gpt-4", "prompt": "a", "max_tokens": 2}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(e["code"], "model_not_found");
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"model": "genslot", "prompt": "a", "max_tokens": 2}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["model"], "genslot-test");
    let models: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["aliases"], json!(["genslot"]));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn token_ids_above_the_vocabulary_are_refused() {
    let s = Server::start(fast()).await;
    let e = error_of(
        s.post(
            "/v1/completions",
            &json!({"prompt": [5, 4_000_000], "max_tokens": 2}),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("invalid_prompt"), Some("prompt"))
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn wrong_methods_and_routes_get_json_errors() {
    let s = Server::start(fast()).await;
    let get = s.get("/v1/completions").await;
    assert_eq!(get.headers()["allow"], "POST");
    let e = error_of(get, 405).await;
    assert_eq!(e["code"], "method_not_allowed");
    let put = s
        .client
        .put(s.url("/v1/chat/completions"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(put, 405).await["code"], "method_not_allowed");
    let post_health = s.post("/health", &json!({})).await;
    assert_eq!(
        error_of(post_health, 405).await["code"],
        "method_not_allowed"
    );
    assert_eq!(
        error_of(s.get("/v2/nothing").await, 404).await["code"],
        "not_found"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_full_queue_says_when_to_retry() {
    let s = Server::start(MockConfig {
        max_live: 1,
        ..fast()
    })
    .await;
    s.engine.hold(true);
    let body = json!({"prompt": "a", "max_tokens": 2, "stream": true});
    let held = s.post("/v1/completions", &body).await;
    assert_eq!(held.status(), 200);
    let refused = s.post("/v1/completions", &body).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    s.engine.hold(false);
    drop(held);
    s.shutdown().await.unwrap();
}

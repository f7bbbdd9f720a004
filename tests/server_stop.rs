//! `stop` strings in the server's output path, over HTTP against the mock engine: a stop
//! string may span tokens; the answer ends before it with finish_reason "stop"; text that
//! only looked like its start is sent; streaming and whole answers agree; and the request is
//! cancelled at the engine so it releases what it holds.

mod server_support;

use std::sync::Arc;

use genslot::server::mock::MockConfig;
use genslot::server::tokenize::Tokenizer;
use serde_json::{json, Value};
use server_support::*;

/// Token i decodes to `PIECES[i]`.
struct Pieces;

const PIECES: &[&str] = &[
    " The", " answer", " is", " E", "ND", "<|", "eo", "t|>", " more", " EN", "X",
];

impl Tokenizer for Pieces {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.split_whitespace().map(|_| 0).collect()
    }
    fn decode_token(&self, id: u32) -> String {
        PIECES.get(id as usize).unwrap_or(&"?").to_string()
    }
}

async fn server(script: &[u32]) -> Server {
    Server::start_with(
        MockConfig {
            script: script.to_vec(),
            ..fast()
        },
        |app| app.with_tokenizer(Arc::new(Pieces)),
    )
    .await
}

/// The streamed text, finish reason and usage of one streaming request.
async fn streamed(s: &Server, stop: Value) -> (String, Value, Value) {
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "q", "max_tokens": 20, "stream": true, "stop": stop,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let chunks = chunks(&r.text().await.unwrap());
    let (usage, rest) = chunks.split_last().unwrap();
    let text = rest
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    let reason = rest.last().unwrap()["choices"][0]["finish_reason"].clone();
    (text, reason, usage["usage"]["completion_tokens"].clone())
}

async fn whole(s: &Server, stop: Value) -> (String, Value, Value) {
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"prompt": "q", "max_tokens": 20, "stop": stop}),
        )
        .await
        .json()
        .await
        .unwrap();
    (
        v["choices"][0]["text"].as_str().unwrap().to_owned(),
        v["choices"][0]["finish_reason"].clone(),
        v["usage"]["completion_tokens"].clone(),
    )
}

#[tokio::test]
async fn a_stop_split_across_two_tokens_ends_the_answer_before_it() {
    // " The answer is E" + "ND" + " more" …
    let s = server(&[0, 1, 2, 3, 4, 8]).await;
    for answer in [
        streamed(&s, json!("END")).await,
        whole(&s, json!("END")).await,
    ] {
        assert_eq!(
            answer,
            (" The answer is ".to_owned(), json!("stop"), json!(5))
        );
    }
    // The engine was told to stop each request: nothing left running.
    assert!(s.engine.wait_idle(WAIT).await);
    assert_eq!(s.engine.cancelled().len(), 2);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stop_split_across_three_tokens_ends_the_answer_before_it() {
    let s = server(&[1, 5, 6, 7, 8]).await;
    let stop = json!(["<|eot|>", "zzz"]);
    let a = streamed(&s, stop.clone()).await;
    let b = whole(&s, stop).await;
    assert_eq!(a, (" answer".to_owned(), json!("stop"), json!(4)));
    assert_eq!(a, b, "streaming and whole answers agree");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_partial_match_that_turns_out_not_to_match_is_sent() {
    // " The EN" + "X" + " more" …: "EN" waits for "D", which never comes.
    let s = server(&[0, 9, 10, 8]).await;
    let expected: String = [0, 9, 10, 8]
        .iter()
        .cycle()
        .take(20)
        .map(|&i| PIECES[i])
        .collect();
    for answer in [
        streamed(&s, json!("END")).await,
        whole(&s, json!("END")).await,
    ] {
        assert_eq!(answer, (expected.clone(), json!("length"), json!(20)));
    }
    assert!(s.engine.cancelled().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn min_tokens_defers_stop_strings_until_that_many_tokens() {
    let s = server(&[3, 4, 0, 3, 4]).await;
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"prompt": "q", "max_tokens": 20, "stop": "END", "min_tokens": 2}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], " END The ");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    s.shutdown().await.unwrap();
}

/// Byte-level tokens: token `b` is the byte `b`, as a byte-level BPE splits a character.
struct Bytes;

impl Tokenizer for Bytes {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn decode_token(&self, id: u32) -> String {
        String::from_utf8_lossy(&[id as u8]).into_owned()
    }
    fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().map(|&id| id as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[tokio::test]
async fn a_character_split_across_tokens_streams_whole_and_can_end_a_stop_string() {
    let script: Vec<u32> = "café! 東京".bytes().map(u32::from).collect();
    let s = Server::start_with(
        MockConfig {
            script: script.clone(),
            ..fast()
        },
        |app| app.with_tokenizer(Arc::new(Bytes)),
    )
    .await;
    let n = script.len();
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "q", "max_tokens": n, "stream": true}),
        )
        .await;
    let text: String = chunks(&r.text().await.unwrap())
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "café! 東京");
    let v: Value = s
        .post(
            "/v1/completions",
            &json!({"prompt": "q", "max_tokens": n, "stop": "é!"}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], "caf");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    s.shutdown().await.unwrap();
}

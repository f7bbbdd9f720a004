//! A KV pool too small for what its residents go on to write never hangs the server: when
//! every running row waits for a page, the newest admission is aborted with an error that
//! names the pool, and the others finish in its pages (`policy::kv_stall`).

mod serve_support;

use serde_json::json;
use serve_support::*;

#[tokio::test]
async fn a_kv_pool_where_every_row_waits_fails_the_newest_request_and_finishes_the_other() {
    // Four pages of 32 tokens; two 32-token prompts that write 60 tokens each need six.
    let cfg =
        config("max_batch_size: 4\nkv_cache_config: { tokens_per_block: 32, max_tokens: 128 }\n");
    let s = Server::start(&cfg).await;
    let body = |first: u32| {
        json!({"prompt": (first..first + 32).collect::<Vec<_>>(), "max_tokens": 60,
               "ignore_eos": true})
    };
    let (a, b) = tokio::time::timeout(
        WAIT,
        futures::future::join(
            s.post("/v1/completions", &body(10)),
            s.post("/v1/completions", &body(100)),
        ),
    )
    .await
    .expect("neither request hangs");
    let mut replies = Vec::new();
    for r in [a, b] {
        let status = r.status().as_u16();
        replies.push((status, r.json::<serde_json::Value>().await.unwrap()));
    }
    replies.sort_by_key(|r| r.0);
    let (ok, failed) = (&replies[0], &replies[1]);
    assert_eq!(ok.0, 200, "{replies:?}");
    assert_eq!(ok.1["usage"]["completion_tokens"], 60, "{ok:?}");
    assert_eq!(failed.0, 503, "{replies:?}");
    let message = failed.1["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("KV cache full (4 pages of 32 tokens)"),
        "{message}"
    );
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l == "genslot_kv_aborts_total 1"),
        "{metrics}"
    );
    s.shutdown().await.unwrap();
}

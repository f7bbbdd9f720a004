//! Shared harness for the server tests: the server on a loopback port with the mock engine,
//! and SSE / error-body helpers.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use genslot::server::mock::{MockConfig, MockEngine};
use genslot::server::tokenize::{Tokenizer, WordTokenizer};
use genslot::server::{serve, App};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const WAIT: Duration = Duration::from_secs(10);

pub struct Server {
    pub base: String,
    pub engine: MockEngine,
    pub client: reqwest::Client,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub async fn start(cfg: MockConfig) -> Self {
        Self::start_with(cfg, |app| app).await
    }

    pub async fn start_with(cfg: MockConfig, configure: impl FnOnce(App) -> App) -> Self {
        let engine = MockEngine::new(cfg);
        let metrics = genslot::metrics::install_recorder().expect("recorder");
        let app = configure(App::new(
            Arc::new(engine.clone()),
            metrics,
            "genslot-test".into(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, async {
            let _ = stopped.await;
        }));
        Server {
            base,
            engine,
            client: reqwest::Client::new(),
            stop: Some(stop),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("send")
    }

    pub async fn post_raw(&self, path: &str, body: &'static str) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("send")
    }

    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_string()
        })
        .collect()
}

/// Splits a finished stream into its JSON chunks, checking it ends with `[DONE]`.
pub fn chunks(body: &str) -> Vec<Value> {
    let mut data = sse_data(body);
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "stream: {body}");
    data.iter()
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect()
}

pub fn count_tokens(text: &str) -> usize {
    WordTokenizer::default().encode(text).len()
}

pub fn prompt_of(words: usize) -> String {
    vec!["word"; words].join(" ")
}

pub fn fast() -> MockConfig {
    MockConfig::default()
}

pub async fn assert_openai_error(r: reqwest::Response, status: u16, code: &str) {
    assert_eq!(r.status(), status);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v: Value = r.json().await.expect("error body is JSON");
    let e = &v["error"];
    assert!(
        !e["message"].as_str().unwrap_or("").is_empty(),
        "message in {v}"
    );
    assert!(e["type"].is_string(), "type in {v}");
    assert!(e.get("param").is_some(), "param in {v}");
    assert_eq!(e["code"], code, "{v}");
}

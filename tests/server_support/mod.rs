//! Shared harness for the server tests: the server on a loopback port with the mock engine,
//! and SSE / error-body helpers.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use genslot::server::mock::{MockConfig, MockEngine};
use genslot::server::tokenize::{Tokenizer, WordTokenizer};
use genslot::server::App;
use serde_json::Value;

pub mod loopback;
#[allow(unused_imports)] // not every test file uses every helper
pub use loopback::{chunks, sse_data, Loopback};

pub const WAIT: Duration = Duration::from_secs(10);

pub struct Server {
    pub http: Loopback,
    pub engine: MockEngine,
}

impl std::ops::Deref for Server {
    type Target = Loopback;
    fn deref(&self) -> &Loopback {
        &self.http
    }
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
        Server {
            http: Loopback::start(app).await,
            engine,
        }
    }

    pub async fn shutdown(self) -> std::io::Result<()> {
        self.http.shutdown_within(WAIT).await
    }
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

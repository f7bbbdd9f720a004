//! The HTTP server on a loopback port in front of any engine, and the SSE helpers; shared by
//! the mock-engine harness (`server_support`) and the actor-engine harness (`serve_support`).

use std::time::Duration;

use genslot::server::{serve, App};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Loopback {
    pub base: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Loopback {
    pub async fn start(app: App) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, async {
            let _ = stopped.await;
        }));
        Loopback {
            base,
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

    /// Signals shutdown; the server keeps answering while it drains.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops the server and waits up to `wait` for `serve` to return.
    pub async fn shutdown_within(mut self, wait: Duration) -> std::io::Result<()> {
        self.begin_shutdown();
        tokio::time::timeout(wait, self.task)
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

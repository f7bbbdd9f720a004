//! Shared harness for the `serve_*` tests: the actor engine over the timing-model backend,
//! with a fast timing config, behind the HTTP server on a loopback port.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use genslot::actors::{ActorEngine, StartOptions};
use genslot::config::Config;
use genslot::gpu::model::ModelBackend;
use genslot::server::{App, Limits};
use genslot::timing::{Clock, RealClock};
use serde_json::Value;

#[path = "../server_support/loopback.rs"]
mod loopback;
#[allow(unused_imports)] // not every test file streams
pub use loopback::{chunks, Loopback};

pub const WAIT: Duration = Duration::from_secs(20);

/// Millisecond steps and transfers, so a test of thousands of steps takes seconds.
pub const FAST_TIMING: &str =
    "timing: { base_ms: 1.0, per_request_ms: 0.02, per_kv_token_ns: 0.0, \
     transfer_base_ms: 2.0, transfer_per_token_us: 0.0 }\n";

/// The fast timing plus `extra`; no stat line unless `extra` asks for one.
pub fn config(extra: &str) -> Config {
    let mut cfg =
        Config::from_yaml_str(&format!("{FAST_TIMING}{extra}"), "test").expect("valid test config");
    if !extra.contains("stat_interval_s") {
        cfg.server.stat_interval_s = 3600.0;
    }
    cfg
}

pub struct Server {
    pub http: Loopback,
}

impl std::ops::Deref for Server {
    type Target = Loopback;
    fn deref(&self) -> &Loopback {
        &self.http
    }
}

pub fn engine(cfg: &Config) -> ActorEngine {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let backend = ModelBackend::from_config(cfg, clock.clone());
    ActorEngine::start(cfg, Box::new(backend), clock, StartOptions::default()).expect("start")
}

impl Server {
    /// The engine and the server's limits from `cfg`.
    pub async fn start(cfg: &Config) -> Self {
        Self::with_limits(engine(cfg), Limits::from_config(&cfg.server)).await
    }

    pub async fn with_engine(engine: ActorEngine) -> Self {
        Self::with_limits(engine, Limits::default()).await
    }

    pub async fn with_limits(engine: ActorEngine, limits: Limits) -> Self {
        let metrics = genslot::metrics::install_recorder().expect("recorder");
        let app = App::new(Arc::new(engine), metrics, "genslot-test".into()).with_limits(limits);
        Server {
            http: Loopback::start(app).await,
        }
    }

    pub async fn debug(&self) -> Value {
        self.client
            .get(self.url("/debug/actors"))
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("debug state is JSON")
    }

    /// A streaming request past its first token: it holds a slot until the returned stream
    /// is dropped, however slowly the test runs (100 000 tokens take minutes).
    pub async fn slot_holder(
        &self,
    ) -> impl futures::Stream<Item = reqwest::Result<impl AsRef<[u8]>>> + Unpin {
        use futures::StreamExt;
        let r = self
            .post(
                "/v1/completions",
                &serde_json::json!({"prompt": "a", "max_tokens": 100000, "ignore_eos": true,
                                    "stream": true}),
            )
            .await;
        assert_eq!(r.status(), 200);
        let mut body = r.bytes_stream();
        let first = tokio::time::timeout(WAIT, body.next()).await;
        assert!(first.is_ok_and(|c| c.is_some()), "the holder's first token");
        body
    }

    /// `(pool, used)` for every pool in `/debug/actors`.
    pub async fn pools_used(&self) -> Vec<(String, u64)> {
        let d = self.debug().await;
        d["worker"]["pools"]
            .as_array()
            .expect("pools")
            .iter()
            .map(|p| {
                (
                    p["pool"].as_str().unwrap_or_default().to_owned(),
                    p["used"].as_u64().unwrap_or(u64::MAX),
                )
            })
            .collect()
    }

    pub async fn shutdown(self) -> std::io::Result<()> {
        self.http.shutdown_within(WAIT).await
    }
}

/// Reads a `genslot serve --port 0` child's standard output on a thread, so the server never
/// blocks on a full pipe: the address it logs that it serves on, and every line as it comes
/// (the channel ends when the process closes its output).
pub fn served_address(
    child: &mut std::process::Child,
) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped standard output");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (log_tx, log_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.split("serving on http://").nth(1) {
                let _ = addr_tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
            let _ = log_tx.send(line);
        }
    });
    let addr = addr_rx
        .recv_timeout(WAIT)
        .expect("the server logs its address");
    (addr, log_rx)
}

/// Log output captured in memory, for tests that read what the server logged.
#[derive(Clone, Default)]
pub struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// A tracing subscriber that writes plain text into `buf`.
pub fn capturing(buf: &Captured) -> impl tracing::Subscriber {
    let b = buf.clone();
    tracing_subscriber::fmt()
        .with_writer(move || b.clone())
        .with_ansi(false)
        .finish()
}

/// Every token a submitted request streams, with when it reached the test, and how it
/// ended; a failure panics with its message.
pub async fn stream_to_end(
    mut sub: genslot::server::engine::Submission,
) -> (
    Vec<(u32, std::time::Instant)>,
    genslot::server::engine::FinishReason,
) {
    use genslot::server::engine::EngineEvent;
    let mut tokens = Vec::new();
    loop {
        let ev = tokio::time::timeout(WAIT, sub.recv())
            .await
            .expect("the request ends")
            .expect("an event");
        match ev {
            EngineEvent::Token { id } => tokens.push((id, std::time::Instant::now())),
            EngineEvent::Finished { reason } => return (tokens, reason),
            EngineEvent::Failed { message } => panic!("request {} failed: {message}", sub.id),
        }
    }
}

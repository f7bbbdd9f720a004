//! The server's limits over loopback against the mock engine, with timeouts of a fraction of
//! a second: slow or idle clients are cut off, a request that runs too long fails with its
//! leases released, and shutdown drains within its window whatever the clients do.

mod server_support;

use std::time::Duration;

use genslot::server::mock::{MockConfig, MockShutdown, SHUTDOWN_MESSAGE};
use genslot::server::Limits;
use serde_json::{json, Value};
use server_support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn limits(
    edit: impl FnOnce(&mut Limits),
) -> impl FnOnce(genslot::server::App) -> genslot::server::App {
    move |app| {
        let mut l = app.limits().clone();
        edit(&mut l);
        app.with_limits(l)
    }
}

async fn raw(s: &Server) -> TcpStream {
    TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// Reads until the server closes the connection (or `within` passes: then `None`).
async fn read_to_close(conn: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = Vec::new();
    match tokio::time::timeout(within, conn.read_to_end(&mut buf)).await {
        Ok(_) => Some(String::from_utf8_lossy(&buf).into_owned()),
        Err(_) => None,
    }
}

/// A completions request's line and headers, before its body's framing.
const POST: &str = "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n";

/// The first bytes the server answers with (within 5 s, else the test fails).
async fn answer(conn: &mut (impl AsyncRead + Unpin)) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn a_client_that_never_finishes_its_header_is_disconnected() {
    let s = Server::start_with(
        fast(),
        limits(|l| l.header_read_timeout = Duration::from_millis(200)),
    )
    .await;
    let mut conn = raw(&s).await;
    conn.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    let answer = read_to_close(&mut conn, Duration::from_secs(5)).await;
    assert!(answer.is_some(), "the server closed the connection");
    assert!(t0.elapsed() >= Duration::from_millis(150));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed() {
    let s = Server::start_with(
        fast(),
        limits(|l| l.header_read_timeout = Duration::from_millis(200)),
    )
    .await;
    let mut conn = raw(&s).await;
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut conn, Duration::from_secs(5))
        .await
        .expect("closed after the idle limit");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_body_that_stalls_gets_408_with_a_json_error() {
    let s = Server::start_with(
        fast(),
        limits(|l| l.body_read_timeout = Duration::from_millis(200)),
    )
    .await;
    let mut conn = raw(&s).await;
    let head = format!("{POST}content-length: 100\r\n\r\n{{\"prompt\":");
    conn.write_all(head.as_bytes()).await.unwrap();
    let answer = answer(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert!(s.engine.submitted().is_empty());
    s.shutdown().await.unwrap();
}

/// The deadline is for the whole body: a byte every 50 ms never stalls long enough for a gap
/// timeout, and would otherwise hold one of `max_connections` for as long as it likes.
#[tokio::test]
async fn a_body_dripped_a_byte_at_a_time_gets_408_at_the_deadline() {
    let s = Server::start_with(
        fast(),
        limits(|l| l.body_read_timeout = Duration::from_millis(300)),
    )
    .await;
    let mut conn = raw(&s).await;
    let head = format!("{POST}content-length: 100\r\n\r\n");
    conn.write_all(head.as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let (mut rd, mut wr) = conn.into_split();
    let drip = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if wr.write_all(b" ").await.is_err() {
                break;
            }
        }
    });
    let answer = answer(&mut rd).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    assert!(s.engine.submitted().is_empty());
    drip.abort();
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_announced_body_past_the_limit_gets_413_before_it_is_sent() {
    let s = Server::start_with(fast(), |app| app.with_max_body_bytes(1024)).await;
    let mut conn = raw(&s).await;
    let head = format!("{POST}content-length: 99999999999\r\n\r\n{{}}");
    conn.write_all(head.as_bytes()).await.unwrap();
    // The default body deadline is a minute: an answer within seconds did not wait for it.
    let answer = answer(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("server.max_body_bytes"), "{answer}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_chunked_body_past_the_limit_gets_413() {
    let s = Server::start_with(fast(), |app| app.with_max_body_bytes(1024)).await;
    let mut conn = raw(&s).await;
    let mut req = format!("{POST}transfer-encoding: chunked\r\n\r\n");
    for _ in 0..3 {
        req += &format!("200\r\n{}\r\n", " ".repeat(0x200));
    }
    conn.write_all(req.as_bytes()).await.unwrap();
    let answer = answer(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"code\":\"invalid_body\""), "{answer}");
    assert!(s.engine.submitted().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn past_max_connections_a_new_client_waits_until_one_closes() {
    let s = Server::start_with(
        fast(),
        limits(|l| {
            l.max_connections = 1;
            l.header_read_timeout = Duration::from_millis(300);
        }),
    )
    .await;
    // Holds the only connection, idle, until the header timeout closes it. The clock starts
    // before it connects, so the timeout cannot have begun earlier.
    let t0 = Instant::now();
    let _idle = raw(&s).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = s.get("/health").await;
    assert_eq!(r.status(), 200);
    assert!(
        t0.elapsed() >= Duration::from_millis(200),
        "served only once the idle connection was closed ({:?})",
        t0.elapsed()
    );
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_past_its_timeout_fails_clearly_and_is_cancelled() {
    let s = Server::start_with(
        MockConfig {
            token_interval: Duration::from_millis(5),
            ..fast()
        },
        // Long enough that a loaded machine still streams a few 5 ms tokens before it.
        limits(|l| l.request_timeout = Duration::from_secs(1)),
    )
    .await;
    let body = json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true});
    let whole = s.post("/v1/completions", &body).await;
    assert_openai_error(whole, 504, "request_timeout").await;

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let r = s.post("/v1/completions", &streaming).await;
    assert_eq!(r.status(), 200, "the stream starts before the timeout");
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "request_timeout");
    assert_eq!(
        error["error"]["type"], "timeout_error",
        "a timeout, not a fault"
    );
    assert!(data.len() > 3, "tokens streamed before the timeout");

    assert!(s.engine.wait_idle(WAIT).await, "both requests released");
    assert_eq!(s.engine.cancelled().len(), 2);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_within_its_window_while_a_client_holds_partial_headers() {
    let drain = Duration::from_millis(600);
    let s = Server::start_with(
        MockConfig {
            token_interval: Duration::from_millis(5),
            shutdown: MockShutdown::Drain,
            ..fast()
        },
        // The header timeout is far off: the drain window alone must end the slow client.
        limits(|l| {
            l.drain_timeout = drain;
            l.header_read_timeout = Duration::from_secs(60);
        }),
    )
    .await;
    let mut slow = raw(&s).await;
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A client mid-header when the drain starts: its request is answered 503.
    let mut late = raw(&s).await;
    late.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    let short = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 20, "ignore_eos": true, "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    let long = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 8000, "ignore_eos": true, "stream": true}),
        )
        .await;
    assert_eq!(
        (short.status().as_u16(), long.status().as_u16()),
        (200, 200)
    );

    let Server { mut http, engine } = s;
    let (base, client) = (http.base.clone(), http.client.clone());
    let t0 = Instant::now();
    http.begin_shutdown();
    let done = tokio::spawn(http.shutdown_within(WAIT));

    // The accept loop is a task that sees the drain when it next runs: poll for the
    // refusal, which must come while the drain is still on.
    while client.get(format!("{base}/health")).send().await.is_ok() {
        assert!(
            !done.is_finished(),
            "new connections are refused during the drain"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !done.is_finished(),
        "new connections are refused during the drain, not only after it"
    );
    late.write_all(b"Host: x\r\n\r\n").await.unwrap();
    let health = read_to_close(&mut late, WAIT).await.expect("answered");
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.contains("shutting_down"), "{health}");

    // A stream that ends inside the window returns every token …
    let short = chunks(&short.text().await.unwrap());
    assert_eq!(short.last().unwrap()["usage"]["completion_tokens"], 20);
    // … the rest get a clear error event when the window closes.
    let data = sse_data(&long.text().await.unwrap());
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["message"], SHUTDOWN_MESSAGE);

    done.await.unwrap().unwrap();
    let took = t0.elapsed();
    assert!(
        took <= drain + Duration::from_secs(2),
        "serve returned {took:?} after the signal"
    );
    assert!(
        took >= drain,
        "the long request ran the whole window ({took:?})"
    );
    assert!(read_to_close(&mut slow, Duration::from_secs(1))
        .await
        .is_some());
    assert_eq!(engine.live(), 0);
}

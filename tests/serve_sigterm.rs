//! `genslot serve` as an operator runs it, stopped with SIGTERM while a client holds a
//! half-sent request: the process exits within the drain window plus 2 s, a stream that ends
//! inside the window returns every token, one that cannot gets a clear error event, and new
//! connections are refused during the drain.

mod serve_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serve_support::served_address;

const DRAIN_S: f64 = 1.0;

struct Serving {
    child: Child,
    addr: String,
    log: std::sync::mpsc::Receiver<String>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(config: &str) -> (Serving, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.yaml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_genslot"))
        .args(["serve", "--port", "0", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (addr, log) = served_address(&mut child);
    (Serving { child, addr, log }, dir)
}

/// Sends a streaming completion and returns the connection to read its answer from.
fn stream(addr: &str, max_tokens: u32) -> TcpStream {
    let body = format!(
        r#"{{"prompt":"a","max_tokens":{max_tokens},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#
    );
    let mut c = TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c
}

/// Reads the answer until its first event: the server then holds the request.
fn first_event(c: &mut TcpStream) -> String {
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&out).contains("data: ") {
        let n = c.read(&mut buf).expect("the server answers");
        assert!(n > 0, "closed before the first event: {out:?}");
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The rest of the answer, after `head`.
fn read_all(mut c: TcpStream, head: String) -> String {
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    head + &String::from_utf8_lossy(&rest)
}

#[test]
fn sigterm_drains_and_exits_within_the_window_while_a_client_holds_partial_headers() {
    let (mut s, _dir) = serve(&format!(
        "timing: {{ base_ms: 2.0, transfer_base_ms: 1.0 }}\n\
         server: {{ drain_timeout_s: {DRAIN_S}, header_read_timeout_s: 60, stat_interval_s: 3600 }}\n"
    ));
    let mut slow = TcpStream::connect(&s.addr).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // ~2 ms a step: 20 tokens end well inside the window, 100 000 cannot. Both are
    // streaming before the signal.
    let mut short = stream(&s.addr, 20);
    let mut long = stream(&s.addr, 100_000);
    let (short_head, long_head) = (first_event(&mut short), first_event(&mut long));

    let t0 = Instant::now();
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let short = std::thread::spawn(move || read_all(short, short_head));
    let long = std::thread::spawn(move || read_all(long, long_head));

    // The listener closes once the process has handled the signal, which a loaded machine
    // may delay: poll for the refusal, and it must come while the process still drains.
    while TcpStream::connect(&s.addr).is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs_f64(DRAIN_S),
            "new connections are still accepted {:?} after SIGTERM",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "new connections are refused during the drain, not only after the exit"
    );
    let status = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            t0.elapsed() < Duration::from_secs_f64(DRAIN_S + 2.0),
            "still running {:?} after SIGTERM",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let short = short.join().unwrap();
    assert!(short.contains("\"completion_tokens\":20"), "{short}");
    assert!(short.contains("data: [DONE]"));
    let long = long.join().unwrap();
    assert!(long.contains("shutting down"), "{long}");
    assert!(long.contains("data: [DONE]"));
    // The process has exited, so its log ends.
    let logs: Vec<String> = s.log.iter().collect();
    for line in &logs {
        assert!(
            !line.contains('\u{1b}'),
            "no colour codes in a redirected log: {line:?}"
        );
    }
    assert!(logs.iter().any(|l| l.contains("shutting down")), "{logs:?}");
}

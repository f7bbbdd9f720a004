//! The leader logs the preemption stat line every `server.stat_interval_s` (SPEC §4.7).

mod serve_support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serve_support::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_stat_line_is_logged_every_interval_with_the_controller_state() {
    let logs = Captured::default();
    let sink = logs.clone();
    // The actors log from their own thread, so the subscriber must be global.
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish(),
    )
    .unwrap();
    let cfg = genslot::config::Config::from_yaml_str(
        &FAST_TIMING.replace("stat_interval_s: 3600", "stat_interval_s: 0.05"),
        "test",
    )
    .unwrap();
    let cfg = {
        let mut c = cfg;
        c.scheduler_config.gen_preemption.tpot_budget = Some(0.1);
        c
    };
    let _engine = engine(&cfg);
    let deadline = tokio::time::Instant::now() + WAIT;
    let lines = loop {
        let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains("preemption: pauses="))
            .map(str::to_owned)
            .collect();
        if lines.len() >= 2 {
            break lines;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for field in [
        "resumes=0",
        "forced=0",
        "paused=0/48",
        "g=1.000",
        "W=",
        "D=-",
        "tpot_inflation=",
    ] {
        assert!(lines[0].contains(field), "{field} in {}", lines[0]);
    }
}

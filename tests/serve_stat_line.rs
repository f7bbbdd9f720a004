//! The leader logs the preemption stat line every `server.stat_interval_s` (SPEC §4.7).

mod serve_support;

use std::time::Duration;

use serve_support::*;

#[tokio::test]
async fn the_stat_line_is_logged_every_interval_with_the_controller_state() {
    let logs = Captured::default();
    // The actors log from their own thread, so the subscriber must be global.
    tracing::subscriber::set_global_default(capturing(&logs)).unwrap();
    let cfg = config(
        "server: { stat_interval_s: 0.05 }\nscheduler_config: { gen_preemption: { tpot_budget: 0.1 } }\n",
    );
    let _engine = engine(&cfg);
    let deadline = tokio::time::Instant::now() + WAIT;
    let lines = loop {
        let all = logs.lines();
        let lines: Vec<String> = all
            .iter()
            .filter(|l| l.contains("preemption: pauses="))
            .cloned()
            .collect();
        if lines.len() >= 2 {
            break lines;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", all.join("\n"));
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
        "kv_waits=0",
        "kv_aborts=0",
    ] {
        assert!(lines[0].contains(field), "{field} in {}", lines[0]);
    }
}

//! Preemption in the running system: under a load that fills the slots requests are paused
//! and every one resumes and returns all its tokens; a pool too small for the paused cap
//! keeps preemption off with exactly one warning; the supervisor can turn it off at run time.

mod serve_support;

use std::sync::Arc;

use serde_json::{json, Value};
use serve_support::*;

const PREEMPT: &str = "max_batch_size: 4\n\
    scheduler_config:\n  gen_admission: { min_samples: 5, target_window: 50 }\n  \
    gen_preemption: { tpot_budget: 0.5 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_full_slot_load_requests_pause_and_every_one_resumes_with_all_its_tokens() {
    let s = Arc::new(Server::start(&config(PREEMPT)).await);
    const LANES: usize = 16;
    const ROUNDS: usize = 4;
    // Lengths differ by lane, so completions (and slot frees) do not fall in lockstep.
    let tokens = |lane: usize| 100 + 10 * (lane as u64 % 11);
    let lanes: Vec<_> = (0..LANES)
        .map(|lane| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for round in 0..ROUNDS {
                    let prompt = format!("lane {lane} round {round} of the load");
                    let max_tokens = tokens(lane);
                    let r = s
                        .post(
                            "/v1/completions",
                            &json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true}),
                        )
                        .await;
                    assert_eq!(r.status(), 200);
                    let v: Value = r.json().await.unwrap();
                    got.push(v["usage"]["completion_tokens"].as_u64());
                }
                got
            })
        })
        .collect();
    for (i, lane) in lanes.into_iter().enumerate() {
        let got = tokio::time::timeout(WAIT * 3, lane).await.unwrap().unwrap();
        assert!(got.iter().all(|t| *t == Some(tokens(i))), "{got:?}");
    }
    let d = s.debug().await;
    let totals = &d["worker"]["preemption"]["totals"];
    let pauses = totals["pauses"].as_u64().unwrap();
    let resumes = totals["resumes"].as_u64().unwrap() + totals["forced_resumes"].as_u64().unwrap();
    assert!(pauses > 0, "no pause happened: {d:#}");
    assert_eq!(resumes, pauses, "every paused request resumed");
    assert_eq!(d["worker"]["preemption"]["paused"], json!([]));
    assert_eq!(d["supervisor"]["enabled"], true);
    let metrics = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("genslot_pauses_total {pauses}")),
        "{metrics}"
    );
    // Every step is timed, and so is the executor's gap between back-to-back steps.
    let count = |name: &str| -> u64 {
        let prefix = format!("{name}_count ");
        (metrics.lines())
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let (steps, gaps) = (
        count("genslot_step_seconds"),
        count("genslot_step_gap_seconds"),
    );
    assert!(steps > 100, "{steps} steps timed");
    assert!(gaps > 0 && gaps < steps, "{gaps} gaps for {steps} steps");
    // Every request's wait for a slot and its context's arrival after it.
    let requests = (LANES * ROUNDS) as u64;
    for name in [
        "genslot_request_queue_time_seconds",
        "genslot_context_arrival_seconds",
    ] {
        assert!(
            count(name) >= requests,
            "{name}: {} of {requests}",
            count(name)
        );
    }
    let used = s.pools_used().await;
    assert!(used.iter().all(|(_, u)| *u == 0), "{used:?}");
}

#[tokio::test]
async fn a_kv_pool_short_of_the_paused_cap_starts_with_preemption_off_and_one_warning() {
    // 8 slots + a paused cap of 3 need 11 residents; 10 pages of 32 tokens hold 10.
    let cfg = config(
        "max_batch_size: 8\nkv_cache_config: { tokens_per_block: 32, max_tokens: 320 }\n\
         scheduler_config: { gen_preemption: { tpot_budget: 0.1 } }\n",
    );
    let logs = Captured::default();
    let engine = tracing::subscriber::with_default(capturing(&logs), || engine(&cfg));
    let warnings: Vec<String> = logs
        .lines()
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("the kv pool holds 10 resident requests, it needs 11"),
        "{}",
        warnings[0]
    );
    let s = Server::with_engine(engine).await;
    let d = s.debug().await;
    let sup = &d["supervisor"];
    assert_eq!(sup["enabled"], false);
    assert_eq!(sup["configured"], json!({"tpot_budget": 0.1}));
    assert_eq!(
        sup["reason"],
        json!({"reason": "pool_short", "pool": "kv", "capacity": 10, "need": 11})
    );
    let warning = sup["warning"].as_str().unwrap();
    assert!(
        warnings[0].ends_with(warning),
        "{warning} vs {}",
        warnings[0]
    );
    // A worker that will not preempt carries no headroom.
    let pools = d["worker"]["pools"].as_array().unwrap();
    assert!(pools.iter().all(|p| p["headroom"] == 0), "{pools:?}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_supervisor_turns_preemption_off_at_run_time_and_says_why() {
    let cfg = config(PREEMPT);
    let logs = Captured::default();
    let _guard = tracing::subscriber::set_default(capturing(&logs));
    let engine = engine(&cfg);
    assert!(logs.lines().is_empty(), "{:?}", logs.lines());
    engine.disable_preemption("operator request");
    engine.disable_preemption("operator request again");
    let st = engine.supervisor_state().await.unwrap();
    assert!(!st.enabled);
    assert_eq!(
        st.warning.as_deref(),
        Some("GEN slot preemption disabled at run time: operator request")
    );
    let s = Server::with_engine(engine).await;
    let d = s.debug().await;
    assert_eq!(d["worker"]["preemption"]["mode"], "off");
    assert_eq!(d["supervisor"]["reason"]["reason"], "disabled");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_configs_initial_gain_is_where_the_served_controller_starts() {
    for (extra, g) in [("", 1.0), (", initial_gain: 0.5", 0.5)] {
        let cfg = config(&format!(
            "scheduler_config:\n  gen_preemption: {{ tpot_budget: 0.1{extra} }}\n"
        ));
        let s = Server::start(&cfg).await;
        let d = s.debug().await;
        assert_eq!(d["worker"]["preemption"]["g"], json!(g), "{d}");
        s.shutdown().await.unwrap();
    }
}

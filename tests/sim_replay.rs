//! Record and replay (SPEC §8.4): `genslot serve --record` writes one line per request, and
//! `genslot sim --replay` replays exactly those arrivals against the modelled plant.

mod cli_support;
mod serve_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cli_support::{genslot, ok};
use genslot::actors::{record, ActorEngine, StartOptions};
use genslot::gpu::model::ModelBackend;
use genslot::policy::Mode;
use genslot::sim::arm::ArmSpec;
use genslot::sim::cli::from_config;
use genslot::sim::engine::{run, ResolvedArm, RunSpec, Workload};
use genslot::timing::{Clock, RealClock, TransferModel};
use genslot::workload::{load_recording, Outcome};
use serde_json::{json, Value};
use serve_support::*;

/// (prompt tokens, max_tokens, delay before sending in ms) of the test's requests.
const REQUESTS: &[(u32, u32, u64)] = &[
    (40, 12, 0),
    (7, 3, 2),
    (120, 20, 0),
    (64, 9, 5),
    (33, 15, 1),
    (90, 4, 7),
    (12, 18, 0),
    (75, 6, 3),
    (50, 11, 4),
    (5, 2, 0),
];

async fn send_all(base: &str) -> Vec<Value> {
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for (i, &(prompt, max_tokens, delay_ms)) in REQUESTS.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let ids: Vec<u32> = (0..prompt)
            .map(|j| 100 + (j * 7 + i as u32) % 500)
            .collect();
        let body = json!({"prompt": ids, "max_tokens": max_tokens, "ignore_eos": true});
        let (client, url) = (client.clone(), format!("{base}/v1/completions"));
        tasks.push(tokio::spawn(async move {
            let r = client.post(url).json(&body).send().await.expect("send");
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.expect("JSON answer")
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

#[tokio::test]
async fn a_recorded_run_replayed_under_the_serving_config_reproduces_its_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("served.jsonl");
    // Two slots for ten requests: some wait, so arrivals and first tokens differ.
    let cfg = config("max_batch_size: 2\n");
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let (recorder, writer) = record::start(&path, clock.as_ref()).unwrap();
    let backend = ModelBackend::from_config(&cfg, clock.clone());
    let opts = StartOptions {
        recorder: Some(recorder),
        ..StartOptions::default()
    };
    let engine = ActorEngine::start(&cfg, Box::new(backend), clock, opts).unwrap();
    let server = Server::with_engine(engine).await;
    let answers = send_all(&server.base).await;
    assert!(answers
        .iter()
        .all(|a| a["choices"][0]["finish_reason"] == "length"));
    server.shutdown().await.unwrap();
    assert_eq!(writer.finish().unwrap(), REQUESTS.len() as u64);

    let rec = load_recording(&path).unwrap();
    assert_eq!(rec.records.len(), REQUESTS.len());
    let mut served: Vec<(u32, u32)> = rec
        .records
        .iter()
        .map(|r| (r.context_tokens, r.max_tokens))
        .collect();
    let mut sent: Vec<(u32, u32)> = REQUESTS.iter().map(|&(p, m, _)| (p, m)).collect();
    served.sort_unstable();
    sent.sort_unstable();
    assert_eq!(
        served, sent,
        "every request is recorded with what it asked for"
    );
    // Each line splits its TTFT: queue wait (arrival → admitted), the context's arrival
    // (admitted → KV ready: at least the modelled transfer, which the backend sleeps), and
    // the wait for the first step that schedules it (KV ready → first token).
    let transfer = TransferModel::from_timing(&cfg.timing);
    for r in &rec.records {
        assert_eq!(r.outcome, Outcome::Completed);
        assert_eq!(r.output_tokens, r.max_tokens);
        let first = r.first_token_s.expect("a first token");
        let admitted = r.admitted_s.expect("an admission time");
        let ready = r.kv_ready_s.expect("a KV-ready time");
        assert!(
            r.arrival_s <= admitted && admitted <= ready && ready <= first && first <= r.finish_s,
            "{r:?}"
        );
        assert!(
            ready - admitted >= transfer.transfer_s(r.context_tokens) - 1e-6,
            "{r:?}"
        );
    }
    assert!(
        rec.records
            .iter()
            .any(|r| r.admitted_s.unwrap() - r.arrival_s > 0.01),
        "with two slots for ten requests some wait for one"
    );

    let (plant, admission) = from_config(&cfg);
    let spec = RunSpec {
        plant,
        admission,
        workload: Workload::Recorded(
            Arc::from(rec.timed_requests()),
            vec![true; rec.records.len()].into(),
        ),
        concurrency: 1,
        duration_s: rec.span_s() + 1e-3,
        warmup_s: 0.0,
        seed: 0,
    };
    let arm = ResolvedArm {
        spec: ArmSpec::control(),
        mode: Mode::Off,
    };
    let out = run(&spec, &arm, true).unwrap();
    let t0 = rec.first_arrival_s();
    assert_eq!(out.issued.len(), rec.records.len());
    for (issued, r) in out.issued.iter().zip(&rec.records) {
        assert_eq!(issued.send_at, r.arrival_s - t0, "same arrival time");
        assert_eq!(issued.input_tokens, r.context_tokens, "same context");
        assert_eq!(issued.max_tokens, r.max_tokens, "same max_tokens");
        assert!(!issued.warmup);
    }
    assert_eq!(
        out.records.len(),
        rec.records.len(),
        "every replayed request finishes"
    );
    assert_eq!(out.unfinished, 0);

    // A request the served run did not complete (cancelled at its end, say) is replayed
    // but not measured: the simulated numbers cover the served ones' requests.
    let mut completed = vec![true; rec.records.len()];
    completed[0] = false;
    let partial = RunSpec {
        workload: Workload::Recorded(Arc::from(rec.timed_requests()), completed.into()),
        ..spec
    };
    let out = run(&partial, &arm, true).unwrap();
    assert_eq!(out.issued.len(), rec.records.len(), "still replayed");
    assert_eq!(out.records.len(), rec.records.len() - 1, "not measured");
}

async fn wait_healthy(base: &str) {
    let client = reqwest::Client::new();
    let t0 = Instant::now();
    while t0.elapsed() < WAIT {
        if let Ok(r) = client.get(format!("{base}/health")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server at {base} did not come up");
}

fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let t0 = Instant::now();
    while t0.elapsed() < WAIT {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("the server did not exit after SIGTERM");
}

fn write_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("serve.yaml");
    std::fs::write(
        &path,
        "max_batch_size: 2\nserver: { stat_interval_s: 3600 }\n\
         timing: { base_ms: 2.0, per_request_ms: 0.05, per_kv_token_ns: 1.0, \
         transfer_base_ms: 3.0, transfer_per_token_us: 5.0 }\n",
    )
    .unwrap();
    path
}

#[tokio::test]
async fn serve_with_record_then_sim_replay_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let rec = dir.path().join("served.jsonl");
    let mut server = genslot()
        .args(["serve", "--port", "0", "--config"])
        .arg(&cfg)
        .arg("--record")
        .arg(&rec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start genslot serve");
    let base = format!("http://{}", served_address(&mut server).0);
    wait_healthy(&base).await;
    let answers = send_all(&base).await;
    assert_eq!(answers.len(), REQUESTS.len());
    // SIGTERM: the server drains, then the recorder flushes before the process exits.
    let killed = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert!(wait_exit(&mut server).success());
    let lines = std::fs::read_to_string(&rec).unwrap();
    assert_eq!(lines.lines().count(), REQUESTS.len());

    let json = dir.path().join("replay.json");
    let svg = dir.path().join("replay.svg");
    let out = genslot()
        .args([
            "sim",
            "--quiet",
            "--arms",
            "control,tpot_budget=0.10",
            "--replay",
        ])
        .arg(&rec)
        .arg("--config")
        .arg(&cfg)
        .arg("--json")
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .expect("run genslot sim");
    let stdout = ok(&out);
    assert!(stdout.contains("served (recorded)"), "{stdout}");
    assert!(stdout.contains("simulated control"), "{stdout}");
    // Headed by the replay and its files, one seed (the arrivals are fixed), no note on seeds.
    assert!(
        stdout.contains("== replay, recording served.jsonl, config serve.yaml, 1 seed x "),
        "{stdout}"
    );
    assert!(!stdout.contains("identical"), "{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["served"]["completed"], REQUESTS.len());
    assert_eq!(v["seeds"], 1);
    assert_eq!(v["workload"]["kind"], "replay", "{v}");
    assert_eq!(v["workload"]["open_loop"], true, "{v}");
    assert_eq!(v["config"], cfg.to_str().unwrap(), "{v}");
    let arms = v["arms"].as_array().unwrap();
    assert_eq!(arms.len(), 2);
    for a in arms {
        assert_eq!(a["requests"], REQUESTS.len(), "{}", a["name"]);
    }
    assert_eq!(v["paired"][0]["arm"], "tpot_budget=0.10");
    // The picture holds the served run's curve beside the arms', each in the legend.
    let picture = std::fs::read_to_string(&svg).unwrap();
    for name in ["served (recorded)", "control", "tpot_budget=0.10"] {
        assert!(picture.contains(&format!(">{name}</text>")), "{name}");
    }
    assert_eq!(picture.matches("<polyline").count(), 3, "{picture}");
}

#[test]
fn a_malformed_recording_is_an_error_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"id\":1,\"run_start_unix\":5.0,\"arrival_s\":1.0,\"context_tokens\":10,\
         \"max_tokens\":4,\"output_tokens\":4,\"first_token_s\":1.5,\"finish_s\":2.0,\
         \"pauses\":0,\"outcome\":\"completed\"}\n\
         {\"id\":2,\"run_start_unix\":5.0,\"arrival_s\":1.0,\"context_tokens\":10,\
         \"max_tokens\":4,\"output_tokens\":4,\"first_token_s\":1.5,\"finish_s\":2.0,\
         \"pauses\":0,\"outcome\":\"finished\"}\n",
    )
    .unwrap();
    let out = genslot()
        .args(["sim", "--quiet", "--preset", "default", "--replay"])
        .arg(&path)
        .output()
        .expect("run genslot sim");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.jsonl:2: "), "{err}");
    assert!(err.contains("unknown variant `finished`"), "{err}");
}

/// An open-loop trace has no lanes: its report is headed "open loop", not by the
/// `--concurrency` default it ignores, and the JSON says concurrency 0.
#[test]
fn an_open_loop_trace_is_headed_open_loop_not_by_a_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = genslot()
        .args([
            "sim",
            "--preset",
            "default",
            "--trace",
            "tests/fixtures/workload/azure.csv",
        ])
        .args([
            "--seeds",
            "1",
            "--duration",
            "60",
            "--warmup",
            "0",
            "--arms",
            "control",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run genslot sim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("== open loop, Azure trace azure.csv, preset default"),
        "{text}"
    );
    assert!(!text.contains("== c220"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["concurrency"], 0, "{v}");
}

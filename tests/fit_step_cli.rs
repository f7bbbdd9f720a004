//! `genslot fit-step`'s refusals: grids of two models or cards, a fit that a config would
//! refuse, and a transfer record that gives no transfer time are errors naming the cause,
//! not a timing section `serve` refuses later or a fit that silently leaves the transfer out.

use std::process::Command;

fn fit(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_genslot"))
        .arg("fit-step")
        .args(args)
        .output()
        .expect("run genslot fit-step");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn written(name: &str, text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path.to_string_lossy().into_owned())
}

/// A grid whose step time at `ms(batch, context)`.
fn grid(ms: impl Fn(u32, u64) -> f64) -> String {
    let mut steps = Vec::new();
    for batch in [1u32, 8, 32, 64] {
        for context in [1024u64, 4096, 16384] {
            steps.push(serde_json::json!({"batch": batch, "context": context, "graph_ms": ms(batch, context)}));
        }
    }
    serde_json::json!({"device": "NVIDIA H200", "shape": "llama-8b", "steps": steps}).to_string()
}

#[test]
fn grids_of_two_models_are_refused_naming_both() {
    let (ok, text) = fit(&[
        "docs/h200/bench-llama-8b.json",
        "docs/h200/bench-llama-1b.json",
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("llama-1b") && text.contains("one model on one card"),
        "{text}"
    );
}

#[test]
fn a_fit_that_a_config_would_refuse_is_an_error_not_a_timing_section() {
    let (_d, rising) = written(
        "rising.json",
        &grid(|b, c| 5.0 + 0.05 * f64::from(b) + 3e-5 * (u64::from(b) * c) as f64),
    );
    let (ok, text) = fit(&[&rising]);
    assert!(ok, "{text}");
    assert!(text.contains("per_kv_token_ns"), "{text}");
    // Step time falling with context: a negative per-token cost.
    let (_d, falling) = written(
        "falling.json",
        &grid(|b, c| 50.0 + 0.05 * f64::from(b) - 3e-5 * (u64::from(b) * c) as f64),
    );
    let (ok, text) = fit(&[&falling]);
    assert!(!ok, "{text}");
    assert!(text.contains("not a usable timing section"), "{text}");
}

#[test]
fn a_transfer_record_that_gives_no_transfer_time_is_an_error() {
    let (_d, g) = written(
        "grid.json",
        &grid(|b, c| 5.0 + 0.05 * f64::from(b) + 3e-5 * (u64::from(b) * c) as f64),
    );
    let (_r, record) = written(
        "failed.jsonl",
        "{\"id\":1,\"run_start_unix\":5.0,\"arrival_s\":1.0,\"context_tokens\":10,\
         \"max_tokens\":4,\"output_tokens\":0,\"finish_s\":2.0,\
         \"pauses\":0,\"outcome\":\"failed\"}\n",
    );
    let (ok, text) = fit(&[&g, "--transfer-record", &record]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("--transfer-record")
            && text.contains("no request in it gives a transfer time"),
        "{text}"
    );
}

//! `genslot fit-step`'s refusals: grids of two models or cards, a fit that a config would
//! refuse, and a transfer record that gives no transfer time are errors naming the cause,
//! not a timing section `serve` refuses later or a fit that silently leaves the transfer out.

mod cli_support;

use cli_support::genslot;

fn fit(args: &[&str]) -> (bool, String) {
    let out = genslot()
        .arg("fit-step")
        .args(args)
        .output()
        .expect("run genslot fit-step");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn written(name: &str, text: &str) -> (tempfile::TempDir, String) {
    let (dir, path) = cli_support::written(name, text);
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

/// A step the bench ran on aliased pages (a batch whose KV the card cannot hold) read the
/// same pages again and again: it is left out of the fit, and the output says which.
#[test]
fn steps_run_on_aliased_pages_are_left_out_of_the_fit_and_named() {
    let line = |b: u32, c: u64| 5.0 + 0.05 * f64::from(b) + 3e-5 * (u64::from(b) * c) as f64;
    let clean = grid(line);
    let (_c, clean) = written("clean.json", &clean);
    // The same grid with one more step, aliased and far off the line.
    let mut v: serde_json::Value = serde_json::from_str(&grid(line)).unwrap();
    v["steps"].as_array_mut().unwrap().push(serde_json::json!({
        "batch": 128, "context": 16384, "graph_ms": 1.0, "pages_aliased": true
    }));
    let (_a, aliased) = written("aliased.json", &v.to_string());
    let (ok, with) = fit(&[&aliased]);
    assert!(ok, "{with}");
    assert!(
        with.contains("left out: batch 128 at 16384 (pages aliased"),
        "{with}"
    );
    let (ok, without) = fit(&[&clean]);
    assert!(ok, "{without}");
    let model = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("step model:"))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(!model(&with).is_empty(), "{with}");
    assert_eq!(model(&with), model(&without));
}

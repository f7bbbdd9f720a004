//! Preemption on a KV pool sized for the batch and a little more (llama-8b on an 80 GB card,
//! `tools/gpu/h100-llama-8b-control.yaml`): pauses keep their victims' pages, and before a
//! pause had to leave room for every resident to finish, this load filled the pool with
//! residents that all needed a page to grow. No row could step, none finished, none freed a
//! page: the worker stopped for good and the `tpot_budget` arm lost 79 % of its throughput
//! (docs/results.md §7). The synthetic sessions need no trace file.

use std::process::Command;

/// `genslot sim` on the H100 plant, synthetic Weka-like sessions, one seed, both arms.
fn run(seed: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_genslot"))
        .args([
            "sim",
            "--quiet",
            "--config",
            "tools/gpu/h100-llama-8b-control.yaml",
            "--synthetic-sessions",
            "710",
            "--context-scale",
            "0.015625",
            "--max-context",
            "4096",
            "--concurrency",
            "288",
            "--duration",
            "180",
            "--warmup",
            "60",
            "--first-seed",
            seed,
            "--seeds",
            "1",
            "--arms",
            "control,tpot_budget=0.10",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run genslot sim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

#[test]
fn pauses_never_fill_the_kv_pool_with_residents_that_cannot_finish() {
    let v = run("0");
    let (control, tpot) = (&v["arms"][0], &v["arms"][1]);
    assert_eq!(tpot["name"], "tpot_budget=0.10", "{v}");
    assert_eq!(
        tpot["unfinished"], 0,
        "every measured request finished: {tpot}"
    );
    let ratio = tpot["total_tps"].as_f64().unwrap() / control["total_tps"].as_f64().unwrap();
    assert!(
        ratio > 0.97,
        "throughput {ratio:.3} of the control's: {tpot}"
    );
}

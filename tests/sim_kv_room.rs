//! Preemption on a KV pool sized for the batch and a little more (llama-8b on an 80 GB card,
//! `tools/gpu/h100-llama-8b-control.yaml`): pauses keep their victims' pages, and before a
//! pause had to leave room for every resident to finish, this load filled the pool with
//! residents that all needed a page to grow. No row could step, none finished, none freed a
//! page: the worker stopped for good and the `tpot_budget` arm lost 79 % of its throughput
//! (docs/results.md §7). And a pool too small for what its residents go on to write stopped
//! the worker without any pause, until a stalled pass learned to abort its newest admission
//! (`policy::kv_stall`, docs/results.md §7.1). The synthetic sessions need no trace file.

mod cli_support;

const H100: &str = "tools/gpu/h100-llama-8b-control.yaml";
/// The same plant with 2,048 tokens of KV a slot.
const KV_SHORT: &str = "tests/fixtures/config/h100-llama-8b-kv-short.yaml";

/// `genslot sim` on an H100 plant, synthetic Weka-like sessions, one seed.
fn run(config: &str, seed: &str, arms: &str) -> serde_json::Value {
    let (_, v) = cli_support::sim_json(&[
        "--config",
        config,
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
        arms,
    ]);
    v
}

#[test]
fn pauses_never_fill_the_kv_pool_with_residents_that_cannot_finish() {
    let v = run(H100, "0", "control,tpot_budget=0.10");
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

#[test]
fn a_kv_pool_too_small_for_its_residents_aborts_a_few_requests_instead_of_stopping() {
    let v = run(KV_SHORT, "0", "control");
    let control = &v["arms"][0];
    let (done, aborted) = (&control["requests"], &control["kv_aborts"]);
    let (done, aborted) = (done.as_u64().unwrap(), aborted.as_u64().unwrap());
    // Before the rule the worker stopped 20 s in: nothing measured at all.
    assert!(done > 800, "{control}");
    assert_eq!(control["unfinished"], 0, "{control}");
    assert!(aborted > 0, "this pool stalls: {control}");
    assert!(
        aborted * 10 < done,
        "an abort a stall, and growth first, keep aborts rare: {control}"
    );
}

/// The KV-short plant is the H100 plant but for its pool: a fixture that drifted from it
/// would test another card.
#[test]
fn the_kv_short_fixture_is_the_h100_plant_with_a_smaller_pool() {
    let lines = |path: &str| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.replace("max_tokens: 262144", "max_tokens: 425984"))
            .collect()
    };
    assert_eq!(lines(KV_SHORT), lines(H100));
}

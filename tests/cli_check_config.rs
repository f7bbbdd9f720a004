//! `genslot check-config` as a user runs it.

mod cli_support;

use cli_support::genslot;

#[test]
fn check_config_accepts_the_embedded_default_and_prints_it_resolved() {
    let out = genslot()
        .args(["check-config", "config/default.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("max_num_active_requests: 128"), "{text}");
}

#[test]
fn check_config_rejects_both_preemption_modes_naming_both_fields_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("both.yaml");
    std::fs::write(
        &path,
        "max_batch_size: 64\nscheduler_config:\n  gen_preemption:\n    tpot_budget: 0.1\n    target_output_tps: 30\n",
    )
    .unwrap();
    let out = genslot().arg("check-config").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tpot_budget") && err.contains("target_output_tps"),
        "{err}"
    );
    assert!(
        err.contains(":4:") || err.contains("line 4"),
        "names the line: {err}"
    );
}

#[test]
fn check_config_on_the_example_files_succeeds() {
    for f in ["config/preempt-tpot.yaml", "config/preempt-target.yaml"] {
        let out = genslot().args(["check-config", f]).output().unwrap();
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

//! `genslot sim`'s command line: a value outside its flag's rule is refused naming the flag
//! and the rule, before anything runs.

use std::process::Command;

fn genslot() -> Command {
    Command::new(env!("CARGO_BIN_EXE_genslot"))
}

/// `genslot sim ARGS` refused: its standard error.
fn refused(args: &[&str]) -> String {
    let out = genslot()
        .args(["sim", "--quiet", "--seeds", "1"])
        .args(args)
        .output()
        .expect("run genslot sim");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} was accepted: {err}");
    err
}

#[test]
fn a_number_outside_its_flags_rule_is_refused_naming_the_flag_and_the_rule() {
    for (args, says) in [
        (
            &["--duration", "-10"][..],
            "--duration must be a number of seconds in (0, 1000000], got -10",
        ),
        (
            &["--duration", "inf"],
            "--duration must be a number of seconds in (0, 1000000], got inf",
        ),
        (
            &["--duration", "1e300"],
            "--duration must be a number of seconds in (0, 1000000], got 1e300",
        ),
        (
            &["--duration", "NaN"],
            "--duration must be a number of seconds",
        ),
        (
            &["--warmup", "-1"],
            "--warmup must be a finite number in [0, 1000000], got -1",
        ),
        (
            &["--warmup", "400", "--duration", "300"],
            "--duration (300) must exceed --warmup (400)",
        ),
        (
            &["--concurrency", "0"],
            "--concurrency must be at least 1, got 0",
        ),
        (
            &["--concurrency", "2000000"],
            "--concurrency must be at most 1048576, got 2000000",
        ),
        (&["--sweep", "130,0"], "--sweep must be at least 1, got 0"),
        (
            &["--rate-scale", "0"],
            "--rate-scale must be a finite number above 0, got 0",
        ),
        (
            &["--rate-scale", "-2"],
            "--rate-scale must be a finite number above 0, got -2",
        ),
        (
            &["--fixed-target", "1e300"],
            "--fixed-target must be a number of seconds in (0, 1000000], got 1e300",
        ),
        (
            &["--target-window", "0"],
            "--target-window must be at least 1, got 0",
        ),
        (
            &["--target-window", "2000000"],
            "--target-window must be at most 1048576",
        ),
        (
            &["--jump-ms", "-1"],
            "--jump-ms must be a finite number in [0, 1000000], got -1",
        ),
        (
            &["--per-request-above-ms", "inf"],
            "--per-request-above-ms must be a finite number in [0, 1000000], got inf",
        ),
        (
            &["--output-scale", "-1"],
            "--output-scale must be a finite number above 0, got -1",
        ),
        (&["--idle-cap", "-1"], "--idle-cap must be >= 0"),
        (&["--context-scale", "2"], "--context-scale: "),
        (&["--max-context", "0"], "--max-context: "),
    ] {
        let err = refused(args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_negative_count_is_read_as_the_flags_value_not_as_a_flag() {
    let err = refused(&["--concurrency", "-5"]);
    assert!(err.contains("'-5' for '--concurrency"), "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");
}

#[test]
fn an_arm_that_breaks_the_configs_rule_is_refused_naming_the_arm_and_the_rule() {
    for (arm, says) in [
        (
            "control,max_batch_size=0",
            "bad arm `max_batch_size=0`: max_batch_size must be at least 1, got 0",
        ),
        (
            "control,max_num_active_requests=0",
            "bad arm `max_num_active_requests=0`: max_num_active_requests must be at least 1, got 0",
        ),
        (
            "control,max_batch_size=100000",
            "bad arm `max_batch_size=100000`: max_batch_size must be at most 65536, got 100000",
        ),
        (
            "control,target_output_tps=inf",
            "bad arm `target_output_tps=inf`: target_output_tps must be a finite rate above 0",
        ),
    ] {
        let err = refused(&["--arms", arm]);
        assert!(err.contains(says), "{arm}: {err}");
    }
}

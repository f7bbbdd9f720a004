//! Shared harness for the tests that run the `genslot` binary as a user does: the command from
//! the repository root, a run that must succeed (its output, or `sim`'s JSON), a run that must
//! be refused (its message), and a small input file.
#![allow(dead_code)] // each test file uses a different subset

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// `genslot`, run from the repository root so that `config/` and `tests/fixtures/` resolve.
pub fn genslot() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_genslot"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// `cmd` run to its end; it must fail: its standard error.
pub fn refused(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run genslot");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{cmd:?} was accepted: {err}");
    err
}

/// `cmd`'s output; it must have succeeded: its standard output.
pub fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `genslot sim --quiet ARGS --json FILE` run to its end: its standard output and the JSON.
pub fn sim_json(args: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = genslot()
        .args(["sim", "--quiet"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run genslot sim");
    let stdout = ok(&out);
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (stdout, v)
}

/// A small file of `text` in a fresh directory (kept while the directory lives).
pub fn written(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

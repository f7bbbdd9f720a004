//! Running the loadgen binary from a test.

/// Runs the loadgen binary with `args` off the async runtime.
pub async fn loadgen(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(args)
            .output()
            .expect("run loadgen")
    })
    .await
    .expect("join")
}

pub fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

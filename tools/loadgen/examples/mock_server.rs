//! A standalone OpenAI-style streaming mock server (the one the tests use), for trying
//! loadgen without a model server and for measuring loadgen's own overhead:
//! `cargo run --release -p loadgen --example mock_server -- 18081 50 10`
//! serves on 127.0.0.1:18081 with a 50 ms first-token delay and 10 ms between tokens.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::Behavior;

fn arg(i: usize, default: u64) -> anyhow::Result<u64> {
    match std::env::args().nth(i) {
        Some(s) => s
            .parse()
            .map_err(|e| anyhow::anyhow!("argument {i} ({s:?}): {e}")),
        None => Ok(default),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let port = arg(1, 18081)?;
    let first = Duration::from_millis(arg(2, 50)?);
    let gap = Duration::from_millis(arg(3, 10)?);
    let behavior = Behavior::Stream {
        first_token_delay: first,
        inter_chunk_delay: gap,
        role_chunk: true,
        tokens_per_chunk: 1,
        usage: true,
    };
    let server =
        common::start_on(&format!("127.0.0.1:{port}"), move |_| behavior, None, false).await?;
    println!(
        "mock server on {} (first token {first:?}, inter-token {gap:?})",
        server.url()
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}

//! Serving connections with their limits, and the graceful drain (SPEC §7).
//!
//! The limits: hyper's header-read timeout (which also closes a connection that sends
//! nothing, fresh or kept alive; HTTP/1.1 only, see below), the body's size and deadline
//! (`body.rs`), and a semaphore of `max_connections` permits in front of `accept` (past it,
//! new connections wait in the kernel's backlog until one closes). A request hyper cannot
//! parse (a garbage request line, a header past its limits) gets hyper's own status with an
//! empty body, since it never reaches the router.
//! hyper-util's `GracefulShutdown` closes idle connections and lets busy ones finish.
//!
//! Shutdown, once the signal resolves: the listener closes (new connections are refused),
//! idle kept-alive connections close (a request that still reaches a handler, one already on
//! its way over a connection, answers 503), the engine lets in-flight
//! requests run for `drain_timeout` and then fails the rest with a clear error, and every
//! connection still open a moment after that (a client that never reads its stream, or
//! never finishes its header) is cut off. `serve` returns within the drain window plus
//! [`FLUSH_GRACE`], whatever the clients do.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::App;
use crate::config::MAX_SECONDS;

/// After the engine ended every request: how long connections get to send their last
/// events before they are closed.
pub const FLUSH_GRACE: Duration = Duration::from_secs(1);
/// Pause after a failed `accept` (e.g. out of file descriptors) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A duration the timers can add to "now" without overflowing.
fn bounded(d: Duration) -> Duration {
    d.min(Duration::from_secs_f64(MAX_SECONDS))
}

/// Serves `app` on `listener` until `shutdown_signal` resolves, then drains as the module
/// says and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown_signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = crate::metrics::spawn_upkeep(app.metrics.clone());
    let limits = app.limits().clone();
    let service = TowerToHyperService::new(app.router());
    // HTTP/1.1 only: with protocol detection hyper waits for a first byte without any
    // timeout, so a client that connects and sends nothing would hold a connection forever.
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounded(limits.header_read_timeout));
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    let mut signal = std::pin::pin!(shutdown_signal);

    loop {
        let permit = tokio::select! {
            biased;
            _ = &mut signal => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break, // never closed
            },
        };
        let stream = tokio::select! {
            biased;
            _ = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection(TokioIo::new(stream), service.clone())
            .into_owned();
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            // Errors are the client's (a reset, a header timeout) and end only its connection.
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
        while connections.try_join_next().is_some() {}
    }

    drop(listener);
    app.begin_shutdown();
    let drain = bounded(limits.drain_timeout);
    let deadline = Instant::now() + drain;
    tracing::info!(
        "shutting down: new connections refused; in-flight requests have {} s to finish",
        drain.as_secs_f64()
    );
    // Idle connections close now; busy ones after their current response.
    let closed = tokio::spawn(graceful.shutdown());
    if tokio::time::timeout_at(deadline + FLUSH_GRACE, app.engine.shutdown(drain))
        .await
        .is_err()
    {
        tracing::error!("the engine did not end its requests within the drain window");
    }
    if tokio::time::timeout_at(deadline + FLUSH_GRACE, closed)
        .await
        .is_err()
    {
        tracing::warn!(
            "closing {} connections still open after the drain window",
            connections.len()
        );
    }
    connections.shutdown().await;
    upkeep.abort();
    tracing::info!("shut down");
    Ok(())
}

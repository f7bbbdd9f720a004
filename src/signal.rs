//! The signals that ask a process to stop: what `genslot serve` drains on and what ends a
//! loadgen run early.

/// Resolves at Ctrl-C (SIGINT) or SIGTERM; never where neither can be listened for.
pub async fn interrupt_or_terminate() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

//! `genslot serve` with the `model` backend: the actor system behind the HTTP server.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;

use super::{ActorEngine, StartOptions};
use crate::config::Config;
use crate::gpu::model::{Clock, ModelBackend, RealClock};
use crate::server::{serve, App};

/// The actor engine over the timing-model backend on the real clock.
pub fn model_engine(cfg: &Config) -> Result<ActorEngine, super::StartError> {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let backend = ModelBackend::from_config(cfg, clock.clone());
    ActorEngine::start(cfg, Box::new(backend), clock, StartOptions::default())
}

/// Binds `server.host:server.port`, serves until `shutdown` resolves, then drains.
pub async fn serve_model(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = crate::metrics::install_recorder()?;
    let engine = model_engine(&cfg)?;
    let addr = format!("{}:{}", cfg.server.host, cfg.server.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(
        "genslot serving on http://{} (backend: model)",
        listener.local_addr().map_or(addr, |a| a.to_string())
    );
    let name = match cfg.model_source() {
        crate::config::ModelSource::Shape { name, .. } => name,
        crate::config::ModelSource::Path(p) => p.display().to_string(),
    };
    let app = App::new(Arc::new(engine), metrics, name);
    serve(listener, app, shutdown).await.context("serving")
}

//! `genslot serve`: the actor system over the configured step backend (`model` or `cuda`)
//! behind the HTTP server.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;

use super::{ActorEngine, StartOptions};
use crate::config::Config;
use crate::gpu::model::{Clock, ModelBackend, RealClock};
use crate::server::{serve, App, Limits};

/// The actor engine over the timing-model backend on the real clock.
pub fn model_engine(cfg: &Config) -> Result<ActorEngine, super::StartError> {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let backend = ModelBackend::from_config(cfg, clock.clone());
    ActorEngine::start(cfg, Box::new(backend), clock, StartOptions::default())
}

/// The actor engine over the CUDA backend: fails with a clear message where CUDA is absent.
pub fn cuda_engine(cfg: &Config) -> anyhow::Result<ActorEngine> {
    use crate::gpu::cuda::{probe_libraries, CudaBackend, CudaConfig, ModelSource};
    probe_libraries().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
    let model = match cfg.model_source() {
        crate::config::ModelSource::Shape { name, seed } => ModelSource::Seeded {
            shape: name,
            seed: seed as u32,
        },
        crate::config::ModelSource::Path(p) => ModelSource::Checkpoint(p),
    };
    let tpb = cfg.kv_cache_config.tokens_per_block.max(1);
    let mut cc = CudaConfig::new(model);
    cc.max_batch_size = cfg.max_batch_size as usize;
    cc.tokens_per_block = tpb as usize;
    // The KV pool's page ids index the device cache, so the device holds every pool page.
    cc.kv_pages = Some((cfg.kv_cache_config.max_tokens / u64::from(tpb)) as usize);
    cc.max_context = (cfg.max_context_tokens as usize).saturating_add(8192);
    cc.max_resident = (cfg.max_num_active_requests() as usize) * 2;
    let backend =
        CudaBackend::new(cc).map_err(|e| anyhow::anyhow!("starting the cuda backend: {e}"))?;
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    Ok(ActorEngine::start(
        cfg,
        Box::new(backend),
        clock,
        StartOptions::default(),
    )?)
}

/// Binds `server.host:server.port`, serves until `shutdown` resolves, then drains.
pub async fn serve_model(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_config(cfg, shutdown).await
}

/// Serves with the backend the config names.
pub async fn serve_config(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = crate::metrics::install_recorder()?;
    let engine = match cfg.backend {
        crate::config::Backend::Model => model_engine(&cfg)?,
        crate::config::Backend::Cuda => cuda_engine(&cfg)?,
    };
    let addr = format!("{}:{}", cfg.server.host, cfg.server.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(
        "genslot serving on http://{} (backend: {:?})",
        listener.local_addr().map_or(addr, |a| a.to_string()),
        cfg.backend
    );
    let app = App::new(Arc::new(engine), metrics, cfg.served_model_name())
        .with_model_aliases(cfg.server.model_aliases.clone())
        .with_limits(Limits::from_config(&cfg.server));
    serve(listener, app, shutdown).await.context("serving")
}

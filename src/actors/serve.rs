//! `genslot serve`: the actor system over the configured step backend (`model` or `cuda`)
//! behind the HTTP server.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use super::{ActorEngine, StartOptions};
use crate::config::Config;
use crate::gpu::model::ModelBackend;
use crate::server::{serve, App, Limits};
use crate::timing::{Clock, RealClock};

/// The actor engine over the timing-model backend on the real clock.
pub fn model_engine(cfg: &Config) -> Result<ActorEngine, super::StartError> {
    model_engine_on(cfg, Arc::new(RealClock::new()), StartOptions::default())
}

fn model_engine_on(
    cfg: &Config,
    clock: Arc<dyn Clock>,
    opts: StartOptions,
) -> Result<ActorEngine, super::StartError> {
    let backend = ModelBackend::from_config(cfg, clock.clone());
    ActorEngine::start(cfg, Box::new(backend), clock, opts)
}

/// The actor engine over the CUDA backend: fails with a clear message where CUDA is absent.
/// `eos_token` (the checkpoint's, from its tokenizer metadata) ends requests and is kept
/// from being sampled before `min_tokens`.
pub fn cuda_engine(cfg: &Config, eos_token: Option<u32>) -> anyhow::Result<ActorEngine> {
    let opts = StartOptions {
        eos_token,
        ..StartOptions::default()
    };
    cuda_engine_on(cfg, Arc::new(RealClock::new()), opts)
}

fn cuda_engine_on(
    cfg: &Config,
    clock: Arc<dyn Clock>,
    opts: StartOptions,
) -> anyhow::Result<ActorEngine> {
    use crate::gpu::cuda::{probe_libraries, ContextMode, CudaBackend, CudaConfig, ModelSource};
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
    cc.eos_token = opts.eos_token;
    cc.step = Some(
        crate::gpu::cuda::StepOptions::from_env_with(cfg.batch_invariant)
            .map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?,
    );
    cc.drafter = (cfg.drafter.max_draft_len > 0).then_some(crate::gpu::cuda::draft::DraftConfig {
        window: cfg.drafter.window_tokens,
        max_draft_len: cfg.drafter.max_draft_len,
        max_ngram: cfg.drafter.max_matching_ngram_size,
    });
    cc.context = match cfg.context {
        crate::config::ContextMode::Prefill => ContextMode::Prefill,
        crate::config::ContextMode::Transfer => ContextMode::Transfer {
            gbps: cfg
                .transfer_gbps
                .unwrap_or(crate::config::DEFAULT_TRANSFER_GBPS),
        },
    };
    let backend =
        CudaBackend::new(cc).map_err(|e| anyhow::anyhow!("starting the cuda backend: {e}"))?;
    Ok(ActorEngine::start(cfg, Box::new(backend), clock, opts)?)
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
    serve_recorded(cfg, None, shutdown).await
}

/// Serves with the backend the config names; with `record`, one line per request that
/// leaves the scheduler goes to that file (`super::record`), flushed once the server drained.
pub async fn serve_recorded(
    cfg: Config,
    record: Option<&Path>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Again after the command line's overrides (`--backend cuda` with several ranks).
    cfg.validate()?;
    let metrics = crate::metrics::install_recorder()?;
    // A checkpoint's tokenizer, chat template and EOS (random-weight shapes keep the word
    // tokenizer).
    let text = match (cfg.backend, cfg.model_source()) {
        (crate::config::Backend::Cuda, crate::config::ModelSource::Path(p)) => {
            Some(crate::text::ModelText::load(&p).context("loading the model's tokenizer")?)
        }
        _ => None,
    };
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let (recorder, writer) = match record {
        Some(path) => {
            let (r, w) = super::record::start(path, clock.as_ref())
                .with_context(|| format!("--record {}", path.display()))?;
            (Some(r), Some(w))
        }
        None => (None, None),
    };
    let opts = StartOptions {
        recorder,
        eos_token: text.as_ref().and_then(|t| t.eos),
        ..StartOptions::default()
    };
    let engine = match cfg.backend {
        crate::config::Backend::Model => model_engine_on(&cfg, clock, opts)?,
        crate::config::Backend::Cuda => cuda_engine_on(&cfg, clock, opts)?,
    };
    let addr = format!("{}:{}", cfg.server.host, cfg.server.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(
        "genslot serving on http://{} (backend: {})",
        listener.local_addr().map_or(addr, |a| a.to_string()),
        crate::policy::names::name(&cfg.backend)
    );
    if let Ok((params, _)) = crate::worker::sizing::resolve(&cfg) {
        tracing::info!("{}", params.summary());
    }
    let mut app = App::new(Arc::new(engine), metrics, cfg.served_model_name())
        .with_model_aliases(cfg.server.model_aliases.clone())
        .with_limits(Limits::from_config(&cfg.server));
    if let Some(t) = &text {
        app = app.with_tokenizer(t.server_tokenizer());
    }
    let served = serve(listener, app, shutdown).await.context("serving");
    if let Some(w) = writer {
        let path = w.path().display().to_string();
        let lines = w.finish().with_context(|| format!("writing {path}"))?;
        tracing::info!("recorded {lines} requests to {path}");
    }
    served
}

//! The configuration's shape (SPEC §10): one struct per YAML mapping, every field defaulted,
//! unknown keys rejected. Field names follow TensorRT-LLM's LLM API where they exist.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The whole configuration file. Parse with [`Config::from_yaml_str`] or [`Config::from_file`],
/// which also resolve derived defaults and validate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub backend: Backend,
    #[serde(deserialize_with = "null_as_default")]
    pub model: ModelConfig,
    /// Most rows in one decode step; CUDA graphs are sized for it.
    pub max_batch_size: u32,
    /// Admission slots. `None` in a file means "same as `max_batch_size`"; parsing resolves it,
    /// so a parsed config always holds `Some`. Read it through
    /// [`Config::max_num_active_requests`].
    pub max_num_active_requests: Option<u32>,
    /// Most tokens in one forward pass (prefill chunks on the cuda backend).
    pub max_num_tokens: u32,
    /// Longest prompt accepted; longer prompts get HTTP 400.
    pub max_context_tokens: u64,
    /// How a request's context reaches the cuda backend (SPEC §6).
    pub context: ContextMode,
    /// Bandwidth of `context: transfer` in GB/s (10⁹ bytes/s); default
    /// [`DEFAULT_TRANSFER_GBPS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_gbps: Option<f64>,
    /// cuda backend: add each request's numbers in the same order whatever its batch, so
    /// its tokens do not depend on whether it ran alone, batched or paused (attention split
    /// by each row's length, one pinned cuBLASLt algorithm per product; slower:
    /// BENCHMARKS.md §3.6). The same as `GENSLOT_BATCH_INVARIANT=1`.
    pub batch_invariant: bool,
    #[serde(deserialize_with = "null_as_default")]
    pub kv_cache_config: KvCacheConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub recurrent_state: RecurrentStateConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub drafter: DrafterConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub parallel: ParallelConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub scheduler_config: SchedulerConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub timing: TimingConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub server: ServerConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: Backend::Model,
            model: ModelConfig::default(),
            max_batch_size: 128,
            max_num_active_requests: None,
            max_num_tokens: 8192,
            max_context_tokens: 1 << 20,
            context: ContextMode::Prefill,
            transfer_gbps: None,
            batch_invariant: false,
            kv_cache_config: KvCacheConfig::default(),
            recurrent_state: RecurrentStateConfig::default(),
            drafter: DrafterConfig::default(),
            parallel: ParallelConfig::default(),
            scheduler_config: SchedulerConfig::default(),
            timing: TimingConfig::default(),
            server: ServerConfig::default(),
        }
    }
}

/// A section written with no value (`gen_preemption:` or `gen_preemption: null`, e.g. after
/// commenting out its fields) means "all defaults", as if it were left out.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Which step backend runs decode (SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The timing model `t(B, ΣL)`: sleeps in real time, runs on any CPU.
    #[default]
    Model,
    /// Real decode on an NVIDIA GPU through cudarc.
    Cuda,
}

/// Model shapes the cuda backend knows by name.
pub const MODEL_SHAPES: &[&str] = &[
    "tiny",
    "llama-1b",
    "llama-8b",
    "tiny-hybrid",
    "llama-hybrid-1b",
];

/// The named shapes with recurrent layers.
pub const HYBRID_SHAPES: &[&str] = &["tiny-hybrid", "llama-hybrid-1b"];

/// Default model shape when neither `shape` nor `path` is set.
pub const DEFAULT_MODEL_SHAPE: &str = "llama-8b";

/// Weights: a named shape random-initialised from `seed`, or a local checkpoint directory.
/// Set `shape` or `path`, not both; with neither, the shape is [`DEFAULT_MODEL_SHAPE`]
/// (filled in when parsing, so a resolved config names it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    pub seed: u64,
    /// A checkpoint: a directory with `config.json` and `*.safetensors` (Hugging Face Llama
    /// layout), or a Llama GGUF file; its tokenizer and chat template come with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// `context: transfer` bandwidth when none is given: one 400 Gb/s link.
pub const DEFAULT_TRANSFER_GBPS: f64 = 50.0;

/// How a request's context (its prompt's KV) arrives on the cuda backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextMode {
    /// Computed here by a real prefill: needed for correct text from real weights.
    #[default]
    Prefill,
    /// Seeded KV written at `transfer_gbps`, as a GEN worker receives it from a context
    /// server (load experiments).
    Transfer,
}

/// Where the weights come from, once `model` is validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    Shape { name: String, seed: u64 },
    Path(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvCacheConfig {
    /// Tokens per KV page; a power of two.
    pub tokens_per_block: u32,
    /// KV capacity in tokens across all pages.
    pub max_tokens: u64,
    /// Sliding-window attention length in tokens; `None` = full attention only.
    pub sliding_window: Option<u32>,
}

impl Default for KvCacheConfig {
    fn default() -> Self {
        KvCacheConfig {
            tokens_per_block: 32,
            max_tokens: 4_000_000,
            sliding_window: None,
        }
    }
}

/// Recurrent (linear-attention / Mamba-like) state for hybrid models.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecurrentStateConfig {
    /// Fixed-size state slots; `None` = the model has no recurrent layers.
    pub slots: Option<u32>,
}

/// Speculative-decoding drafter state: prompt lookup (n-gram) over each request's rolling
/// window of recent tokens, verified by the target model in one step (cuda backend).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrafterConfig {
    /// Drafter arena slots; `None` = no drafter.
    pub slots: Option<u32>,
    /// Rolling window of recent tokens each drafter slot keeps.
    pub window_tokens: u32,
    /// Draft tokens proposed per request per step (k); 0 = the arena keeps windows only.
    pub max_draft_len: u32,
    /// Longest n-gram the lookup matches (it tries this size, then shorter ones down to 1).
    pub max_matching_ngram_size: u32,
}

impl Default for DrafterConfig {
    fn default() -> Self {
        DrafterConfig {
            slots: None,
            window_tokens: 0,
            max_draft_len: 0,
            max_matching_ngram_size: 3,
        }
    }
}

/// Most draft tokens per step the verify pass takes.
pub const MAX_DRAFT_LEN: u32 = 15;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParallelConfig {
    pub tensor_parallel_size: u32,
    pub pipeline_parallel_size: u32,
    pub enable_attention_dp: bool,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            enable_attention_dp: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    #[serde(deserialize_with = "null_as_default")]
    pub gen_admission: GenAdmissionConfig,
    #[serde(deserialize_with = "null_as_default")]
    pub gen_preemption: GenPreemptionConfig,
}

/// Order in which waiters are admitted (SPEC §4.2); one enum shared with the core.
pub use crate::policy::AdmissionPolicy;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenAdmissionConfig {
    pub policy: AdmissionPolicy,
    /// X is this percentile of recent waiting requests' TTFTs; in (0, 100).
    pub ttft_percentile: f64,
    /// How many recent waited TTFTs X is computed over.
    pub target_window: u32,
    /// X is formed once this many samples exist; at most `target_window`.
    pub min_samples: u32,
    /// Queue bound; past it new requests get HTTP 429.
    pub max_waiting: u32,
}

impl Default for GenAdmissionConfig {
    fn default() -> Self {
        GenAdmissionConfig {
            policy: AdmissionPolicy::Auto,
            ttft_percentile: 90.0,
            target_window: 1000,
            min_samples: 200,
            max_waiting: 4096,
        }
    }
}

/// The raw preemption fields as written. Set at most one; read the validated choice through
/// [`Config::preemption`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenPreemptionConfig {
    /// Allowed relative TPOT inflation from pausing, in (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_budget: Option<f64>,
    /// Per-request output rate (tokens/s) that about 80% of requests keep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_output_tps: Option<f64>,
    /// With `tpot_budget`: where its window gain g starts, in [0.25, 2] (default 1). SPEC
    /// §4.3 leaves it open; a start below 1 bounds the TPOT cost of the first minutes, while
    /// g has no completed paused request to learn from (docs/results.md §3, `g0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_gain: Option<f64>,
    /// With `tpot_budget`: which completions step its window gain g (default `any`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gain_from: Option<GainFrom>,
}

/// Which completions step `tpot_budget`'s window gain g: the controller's own rule enum.
pub use crate::policy::preemption::controller::GainFrom;

/// The preemption mode after validation (SPEC §4.3); the core's `Mode`.
pub use crate::policy::Mode as Preemption;

/// The `model` backend's decode step time
/// `t(B, ΣL) = base + B·per_request + ΣL·per_kv_token`, plus
/// `jump_ms + (B − jump_above)·per_request_above_ms` when `B > jump_above`,
/// in milliseconds, plus context-arrival times (SPEC §8.2). The defaults are a generic
/// stand-in of the right order for an 8B model on one GPU, not a measurement; the simulator
/// carries calibrated presets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimingConfig {
    /// Weight-read term of one step, ms.
    pub base_ms: f64,
    /// Per batch row, ms.
    pub per_request_ms: f64,
    /// Per KV token read across the batch, ns.
    pub per_kv_token_ns: f64,
    /// Batch size above which the step takes `jump_ms` longer; `None` = no jump.
    pub jump_above: Option<u32>,
    pub jump_ms: f64,
    /// Extra ms per request past `jump_above`.
    pub per_request_above_ms: f64,
    /// Mean tokens emitted per request per step (> 1 with speculative decoding).
    pub tokens_per_step: f64,
    /// KV transfer time = transfer_base_ms + context tokens · transfer_per_token_us.
    pub transfer_base_ms: f64,
    pub transfer_per_token_us: f64,
    /// Prefill cost per context token when the context is computed here, µs.
    pub prefill_per_token_us: f64,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            base_ms: 60.0,
            per_request_ms: 0.05,
            per_kv_token_ns: 1.0,
            jump_above: None,
            jump_ms: 0.0,
            per_request_above_ms: 0.0,
            tokens_per_step: 1.0,
            transfer_base_ms: 50.0,
            transfer_per_token_us: 2.0,
            prefill_per_token_us: 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    /// 0 asks the OS for a free port.
    pub port: u16,
    /// Seconds between stat lines.
    pub stat_interval_s: f64,
    /// A request still unfinished this many seconds after it was received fails with a
    /// timeout error, and everything it holds is released.
    pub request_timeout_s: f64,
    /// Output-token bound of a request that sets no `max_tokens` (also capped by the
    /// context's rest).
    pub default_max_tokens: u32,
    /// On SIGTERM / Ctrl-C: in-flight requests get this long to finish; then the rest fail
    /// with a clear error and every connection is closed.
    pub drain_timeout_s: f64,
    /// A connection must send a request's whole header within this many seconds; a kept-alive
    /// connection that sends nothing for this long is closed.
    pub header_read_timeout_s: f64,
    /// A request's body must arrive whole within this many seconds of its header.
    pub body_read_timeout_s: f64,
    /// Open connections at most; past it the server stops accepting until one closes.
    pub max_connections: u32,
    /// Largest request body accepted (bytes).
    pub max_body_bytes: u64,
    /// Honour a request's `arrival_time` / `x-arrival-time` (set by a trusted router).
    /// Off: the arrival is the time this server received the request.
    pub trust_arrival_time: bool,
    /// With `trust_arrival_time`: a stamp further than this in the past or the future is
    /// refused (400); one in the future within it counts as "now".
    pub arrival_horizon_s: f64,
    /// The model id in responses and `GET /v1/models`; `None` = the model's shape name or
    /// checkpoint path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// Other names a request's `model` may use for the served model.
    pub model_aliases: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".to_owned(),
            port: 8000,
            stat_interval_s: 30.0,
            request_timeout_s: 600.0,
            default_max_tokens: 4096,
            drain_timeout_s: 30.0,
            header_read_timeout_s: 30.0,
            body_read_timeout_s: 60.0,
            max_connections: 4096,
            max_body_bytes: 64 << 20,
            trust_arrival_time: false,
            arrival_horizon_s: 600.0,
            served_model_name: None,
            model_aliases: Vec::new(),
        }
    }
}

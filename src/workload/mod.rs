//! Workloads: trace loaders, a synthetic agentic generator, and the replay engines shared
//! by the simulator (virtual time) and the load generator (real time).
//!
//! # Formats ([`load_trace`] detects them; gzip is recognised by its magic bytes)
//! - **Weka** ([`load_weka`]): one session per JSON object, a file holding one object or
//!   many (JSONL), or a directory of such files. Requests carry `t`, `in`, `out`,
//!   `hash_ids` or `hash_runs` (`[start, len]` runs), `api_time`, `think_time`; `type:
//!   "subagent"` markers nest child sessions, whose times become absolute session times
//!   (rule and evidence in [`weka`]). Block size from `block_size`, default 64.
//! - **Mooncake FAST'25** ([`load_mooncake`]): JSONL `timestamp` (ms), `input_length`,
//!   `output_length`, `hash_ids` of 512-token blocks.
//! - **Azure LLM inference 2023/2024** ([`load_azure`]): CSV
//!   `TIMESTAMP,ContextTokens,GeneratedTokens`, times relative to the first row.
//!
//! # Replay (caller-driven; nothing here reads a clock)
//! Both engines implement [`Replay`]: `start(now)`, `next_due()`, `pop_due(now)` (issues in
//! `(send_at, id)` order), `on_complete(id, now)`.
//! - [`AgentxReplay`]: closed-loop AgentX lanes over [`Session`]s: random start point with a
//!   flagged warm-up turn, end-to-start gaps with an idle cap, sub-agents inside their
//!   parent's lane, `max_tokens` = recorded output. Rules in [`agentx`].
//! - [`OpenLoopReplay`]: arrivals by timestamp with a rate scale and count/duration caps.
//! - [`SendJitter`]: the seeded delay a closed-loop lane adds after each completion, the
//!   caller's to add to `now` (loadgen's `--send-jitter`, the simulator's too).
//!
//! # Recorded traffic and the context transform
//! [`load_recording`] reads what `genslot serve --record` wrote (format and clock in
//! [`recording`]); [`ContextTransform`] shrinks a trace's contexts to fit one GPU, the same
//! way for the simulator and the load generator (what it keeps and changes: [`context`]).
//!
//! # Synthetic
//! [`SyntheticAgentic`] generates [`Session`]s with defaults fitted to the Weka corpus
//! (fit and numbers in [`synth`]), seeded and deterministic.

pub mod agentx;
pub mod azure;
pub mod context;
pub mod error;
pub mod format;
pub mod issue;
pub mod jitter;
mod ledger;
pub mod mooncake;
pub mod open_loop;
mod plan;
pub mod prefix;
pub mod quantile;
pub mod recording;
mod source;
pub mod synth;
pub mod types;
pub mod weka;
pub(crate) mod window;

pub use agentx::{AgentxReplay, ReplayRules};
pub use azure::load_azure;
pub use context::{ContextTransform, LengthStats, TransformError};
pub use error::{ReplayError, WorkloadError};
pub use format::{load_trace, Trace, TraceFormat};
pub use issue::{Issue, Replay};
pub use jitter::SendJitter;
pub use mooncake::load_mooncake;
pub use open_loop::{OpenLoopReplay, OpenLoopRules};
pub use prefix::PrefixHashes;
pub use quantile::QuantileTable;
pub use recording::{load_recording, Outcome, Recording, ServedRecord};
pub use synth::{SynthParams, SyntheticAgentic};
pub use types::{HashIds, HashRun, Request, Session, Subagent, TimedRequest};
pub use weka::load_weka;

/// Most closed-loop lanes, and synthetic sessions, one run may have (`genslot sim` and
/// loadgen): 100,000 synthetic sessions take about 7 GB, and a million lanes ran out of
/// 24 GB, so past this a typo ends in an allocation failure rather than a load.
pub const MAX_LANES: u64 = 100_000;

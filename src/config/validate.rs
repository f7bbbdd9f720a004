//! The rules a parsed configuration must keep (SPEC §4.3, §4.4, §10). Pure: collects every
//! broken rule, in field order, without positions; the loader adds positions from the text.
//!
//! Sizes are bounded so that nothing derived from them overflows or outgrows the process:
//! the ceilings below keep every count inside the integer types that index it, and
//! `super::host` adds up what the bounded sizes cost against the machine's memory.

use super::error::Issue;
use super::rule;
use super::schema::{Backend, Config, Preemption, MAX_DRAFT_LEN, MODEL_SHAPES};

/// Most batch rows and admission slots. Every slot is an entry of an index pool and a row of
/// the step's buffers; peers run at most a few thousand (TensorRT-LLM's default is 2048).
pub const MAX_ROWS: u64 = 1 << 16;
/// Most entries of the other per-request structures: recurrent and drafter slots, the
/// waiting queue, X's sample window.
pub const MAX_ENTRIES: u64 = 1 << 20;
/// Most tokens in one forward pass and in one drafter window.
pub const MAX_PASS_TOKENS: u64 = 1 << 24;
/// Longest context: a request's prompt + output counts in 32 bits.
pub const MAX_CONTEXT_TOKENS: u64 = u32::MAX as u64;
/// Largest KV page; pages are kept in chunks and copied whole.
pub const MAX_TOKENS_PER_BLOCK: u64 = 1 << 16;
/// Most KV pages: page ids are 32-bit.
pub const MAX_KV_PAGES: u64 = u32::MAX as u64;
/// Longest duration setting, in seconds (about 11.6 days); far beyond any sensible value, and
/// far inside what a timer can hold.
pub const MAX_SECONDS: f64 = 1e6;
/// Largest per-unit time of the timing model (ms, µs or ns per unit): 1000 s of step time
/// per unit already stalls a server.
pub const MAX_TIMING_UNIT: f64 = 1e6;
/// Most tokens a decode step emits per request (speculative decoding).
pub const MAX_TOKENS_PER_STEP: f64 = 1024.0;
/// Largest request body: the body is held in memory whole.
pub const MAX_BODY_BYTES: u64 = 1 << 30;
/// Most open connections (each holds a task and its buffers).
pub const MAX_CONNECTIONS: u64 = 1 << 20;

const TPOT_BUDGET: &str = "scheduler_config.gen_preemption.tpot_budget";
const TARGET_TPS: &str = "scheduler_config.gen_preemption.target_output_tps";
const INITIAL_GAIN: &str = "scheduler_config.gen_preemption.initial_gain";
const GAIN_FROM: &str = "scheduler_config.gen_preemption.gain_from";

/// Every rule `cfg` breaks; empty when it is valid.
pub(crate) fn issues(cfg: &Config) -> Vec<Issue> {
    let mut out = Vec::new();
    model(cfg, &mut out);
    in_range(
        &mut out,
        "max_batch_size",
        u64::from(cfg.max_batch_size),
        MAX_ROWS,
    );
    if let Some(n) = cfg.max_num_active_requests {
        in_range(&mut out, "max_num_active_requests", u64::from(n), MAX_ROWS);
    }
    in_range(
        &mut out,
        "max_num_tokens",
        u64::from(cfg.max_num_tokens),
        MAX_PASS_TOKENS,
    );
    in_range(
        &mut out,
        "max_context_tokens",
        cfg.max_context_tokens,
        MAX_CONTEXT_TOKENS,
    );
    kv_cache(cfg, &mut out);
    if let Some(n) = cfg.recurrent_state.slots {
        in_range(&mut out, "recurrent_state.slots", u64::from(n), MAX_ENTRIES);
    }
    if let Some(n) = cfg.drafter.slots {
        in_range(&mut out, "drafter.slots", u64::from(n), MAX_ENTRIES);
    }
    if u64::from(cfg.drafter.window_tokens) > MAX_PASS_TOKENS {
        out.push(Issue::new(
            "drafter.window_tokens",
            format!(
                "must be at most {MAX_PASS_TOKENS}, got {}",
                cfg.drafter.window_tokens
            ),
        ));
    }
    drafter(cfg, &mut out);
    let p = &cfg.parallel;
    at_least_one(
        &mut out,
        "parallel.tensor_parallel_size",
        u64::from(p.tensor_parallel_size),
    );
    at_least_one(
        &mut out,
        "parallel.pipeline_parallel_size",
        u64::from(p.pipeline_parallel_size),
    );
    tensor_parallel(cfg, &mut out);
    admission(cfg, &mut out);
    preemption(cfg, &mut out);
    timing(cfg, &mut out);
    server(cfg, &mut out);
    out
}

/// The preemption mode the raw fields select, or the rule they break.
pub(crate) fn preemption_mode(cfg: &Config) -> Result<Preemption, Issue> {
    let g = &cfg.scheduler_config.gen_preemption;
    match (g.tpot_budget, g.target_output_tps) {
        (None, None) => Ok(Preemption::Off),
        (Some(_), Some(_)) => Err(Issue::new(
            TPOT_BUDGET,
            "`tpot_budget` and `target_output_tps` are mutually exclusive: set exactly one \
             (or neither, to leave preemption off)",
        )
        .with_related(TARGET_TPS)),
        (Some(b), None) => rule::tpot_budget(b)
            .map(|()| Preemption::TpotBudget(b))
            .map_err(|why| Issue::new(TPOT_BUDGET, why)),
        (None, Some(t)) => rule::target_output_tps(t)
            .map(|()| Preemption::TargetOutputTps(t))
            .map_err(|why| Issue::new(TARGET_TPS, why)),
    }
}

pub(crate) fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Model => "model",
        Backend::Cuda => "cuda",
    }
}

fn at_least_one(out: &mut Vec<Issue>, field: &str, v: u64) {
    if v < 1 {
        out.push(Issue::new(field, format!("must be at least 1, got {v}")));
    }
}

/// 1 ≤ v ≤ max.
fn in_range(out: &mut Vec<Issue>, field: &str, v: u64, max: u64) {
    check(out, field, rule::count(v, max));
}

/// A finite number in [min, max].
fn finite_within(out: &mut Vec<Issue>, field: &str, v: f64, min: f64, max: f64) {
    check(out, field, rule::finite_within(v, min, max));
}

/// A duration in seconds: finite, above 0, at most [`MAX_SECONDS`].
fn seconds(out: &mut Vec<Issue>, field: &str, v: f64) {
    check(out, field, rule::seconds(v));
}

fn check(out: &mut Vec<Issue>, field: &str, kept: Result<(), String>) {
    if let Err(why) = kept {
        out.push(Issue::new(field, why));
    }
}

fn model(cfg: &Config, out: &mut Vec<Issue>) {
    let m = &cfg.model;
    if m.shape.is_some() && m.path.is_some() {
        out.push(
            Issue::new(
                "model.shape",
                "`shape` and `path` are mutually exclusive: name a shape to random-initialise, \
                 or a checkpoint directory to load",
            )
            .with_related("model.path"),
        );
    }
    if let Some(shape) = &m.shape {
        if !MODEL_SHAPES.contains(&shape.as_str()) {
            out.push(Issue::new(
                "model.shape",
                format!(
                    "unknown shape `{shape}`, expected one of: {}",
                    MODEL_SHAPES.join(", ")
                ),
            ));
        }
    }
    if m.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
        out.push(Issue::new("model.path", "must not be empty"));
    }
    if let Some(g) = cfg.transfer_gbps {
        if !(g.is_finite() && g > 0.0 && g <= MAX_TIMING_UNIT) {
            out.push(Issue::new(
                "transfer_gbps",
                format!("must be a finite number in (0, {MAX_TIMING_UNIT}] GB/s, got {g}"),
            ));
        }
    }
}

/// Drafting needs a window that holds a key and a continuation, and a bounded k; a hybrid
/// shape needs recurrent-state slots and cannot draft.
fn drafter(cfg: &Config, out: &mut Vec<Issue>) {
    let hybrid = cfg
        .model
        .shape
        .as_deref()
        .is_some_and(|s| super::schema::HYBRID_SHAPES.contains(&s));
    if hybrid && cfg.recurrent_state.slots.is_none() {
        out.push(
            Issue::new(
                "recurrent_state.slots",
                "a hybrid shape keeps one recurrent state per resident request: set \
                 `recurrent_state.slots` (max_num_active_requests + the paused cap)",
            )
            .with_related("model.shape"),
        );
    }
    let d = &cfg.drafter;
    if d.max_draft_len == 0 {
        return;
    }
    if hybrid {
        out.push(
            Issue::new(
                "drafter.max_draft_len",
                "drafting is not supported with a hybrid shape (its recurrent state cannot be \
                 rolled back past rejected drafts)",
            )
            .with_related("model.shape"),
        );
    }
    if d.slots.is_none() {
        out.push(Issue::new(
            "drafter.max_draft_len",
            "drafting needs drafter slots: set `drafter.slots`",
        ));
    }
    if d.max_draft_len > MAX_DRAFT_LEN {
        out.push(Issue::new(
            "drafter.max_draft_len",
            format!("must be at most {}, got {}", MAX_DRAFT_LEN, d.max_draft_len),
        ));
    }
    at_least_one(
        out,
        "drafter.max_matching_ngram_size",
        u64::from(d.max_matching_ngram_size),
    );
    let need = u64::from(d.max_draft_len) + u64::from(d.max_matching_ngram_size);
    if u64::from(d.window_tokens) < need {
        out.push(
            Issue::new(
                "drafter.window_tokens",
                format!(
                    "must hold an n-gram and a draft (max_matching_ngram_size + \
                     max_draft_len = {need}), got {}",
                    d.window_tokens
                ),
            )
            .with_related("drafter.max_draft_len"),
        );
    }
}

fn kv_cache(cfg: &Config, out: &mut Vec<Issue>) {
    let kv = &cfg.kv_cache_config;
    if !kv.tokens_per_block.is_power_of_two()
        || u64::from(kv.tokens_per_block) > MAX_TOKENS_PER_BLOCK
    {
        out.push(Issue::new(
            "kv_cache_config.tokens_per_block",
            format!(
                "must be a power of two in [1, {MAX_TOKENS_PER_BLOCK}] (e.g. 16, 32, 64), got {}",
                kv.tokens_per_block
            ),
        ));
    } else if kv.max_tokens / u64::from(kv.tokens_per_block) > MAX_KV_PAGES {
        out.push(
            Issue::new(
                "kv_cache_config.max_tokens",
                format!(
                    "{} tokens are {} pages of {}, more than the {MAX_KV_PAGES} pages 32-bit \
                     page ids can name",
                    kv.max_tokens,
                    kv.max_tokens / u64::from(kv.tokens_per_block),
                    kv.tokens_per_block
                ),
            )
            .with_related("kv_cache_config.tokens_per_block"),
        );
    } else if kv.max_tokens < u64::from(kv.tokens_per_block) {
        out.push(
            Issue::new(
                "kv_cache_config.max_tokens",
                format!(
                    "must hold at least one page of {} tokens, got {}",
                    kv.tokens_per_block, kv.max_tokens
                ),
            )
            .with_related("kv_cache_config.tokens_per_block"),
        );
    }
    if let Some(w) = kv.sliding_window {
        in_range(
            out,
            "kv_cache_config.sliding_window",
            u64::from(w),
            MAX_CONTEXT_TOKENS,
        );
    }
}

fn admission(cfg: &Config, out: &mut Vec<Issue>) {
    let a = &cfg.scheduler_config.gen_admission;
    let pct = a.ttft_percentile;
    if !(pct.is_finite() && pct > 0.0 && pct < 100.0) {
        out.push(Issue::new(
            "scheduler_config.gen_admission.ttft_percentile",
            format!("must be in (0, 100), got {pct}"),
        ));
    }
    in_range(
        out,
        "scheduler_config.gen_admission.target_window",
        u64::from(a.target_window),
        MAX_ENTRIES,
    );
    at_least_one(
        out,
        "scheduler_config.gen_admission.min_samples",
        u64::from(a.min_samples),
    );
    if a.min_samples > a.target_window {
        out.push(
            Issue::new(
                "scheduler_config.gen_admission.min_samples",
                format!(
                    "must be <= target_window ({}), got {}: X could never form",
                    a.target_window, a.min_samples
                ),
            )
            .with_related("scheduler_config.gen_admission.target_window"),
        );
    }
    in_range(
        out,
        "scheduler_config.gen_admission.max_waiting",
        u64::from(a.max_waiting),
        MAX_ENTRIES,
    );
}

fn preemption(cfg: &Config, out: &mut Vec<Issue>) {
    let mode = match preemption_mode(cfg) {
        Ok(mode) => mode,
        Err(issue) => {
            out.push(issue);
            return;
        }
    };
    let gain = &cfg.scheduler_config.gen_preemption;
    match mode {
        Preemption::TpotBudget(_) => {
            if let Some(g) = gain.initial_gain {
                use crate::policy::preemption::controller::{G_MAX, G_MIN};
                if let Err(why) = rule::finite_within(g, G_MIN, G_MAX) {
                    out.push(Issue::new(INITIAL_GAIN, why));
                }
            }
        }
        // The window gain's settings belong to `tpot_budget`: each one set beside the other
        // mode, or with none, is refused, related to the field set (or the one missing).
        _ => {
            let related = if mode == Preemption::Off {
                TPOT_BUDGET
            } else {
                TARGET_TPS
            };
            for (field, set, what) in [
                (
                    INITIAL_GAIN,
                    gain.initial_gain.is_some(),
                    "is where `tpot_budget`'s window gain starts",
                ),
                (
                    GAIN_FROM,
                    gain.gain_from.is_some(),
                    "says which completions step `tpot_budget`'s window gain",
                ),
            ] {
                if set {
                    out.push(
                        Issue::new(field, format!("{what}: set it with `tpot_budget` only"))
                            .with_related(related),
                    );
                }
            }
        }
    }
    let on_field = match mode {
        Preemption::Off => return,
        Preemption::TpotBudget(_) => TPOT_BUDGET,
        Preemption::TargetOutputTps(_) => TARGET_TPS,
    };
    let p = &cfg.parallel;
    // A paused request would leave its pipeline micro-batch mid-flight; the reference
    // rejects the combination at argument validation, and so do we.
    if p.pipeline_parallel_size > 1 {
        out.push(
            Issue::new(
                "parallel.pipeline_parallel_size",
                format!(
                    "preemption does not support pipeline parallelism: set \
                     pipeline_parallel_size to 1 or remove `{}`, got {}",
                    last(on_field),
                    p.pipeline_parallel_size
                ),
            )
            .with_related(on_field),
        );
    }
    if p.enable_attention_dp {
        out.push(
            Issue::new(
                "parallel.enable_attention_dp",
                format!(
                    "preemption does not support attention data parallelism: set \
                     enable_attention_dp to false or remove `{}`",
                    last(on_field)
                ),
            )
            .with_related(on_field),
        );
    }
}

/// Ranks per worker the model backend runs (each a thread with its own scheduling core).
pub(crate) const MAX_TENSOR_PARALLEL: u32 = 64;

/// `tensor_parallel_size` > 1 runs that many ranks checking each other's decisions every
/// pass. The model backend runs them on the CPU; the cuda backend steps one GPU, so it
/// refuses more than one rank until its sharded forward runs.
fn tensor_parallel(cfg: &Config, out: &mut Vec<Issue>) {
    const FIELD: &str = "parallel.tensor_parallel_size";
    let n = cfg.parallel.tensor_parallel_size;
    if n > MAX_TENSOR_PARALLEL {
        out.push(Issue::new(
            FIELD,
            format!("must be at most {MAX_TENSOR_PARALLEL} ranks, got {n}"),
        ));
    } else if n > 1 && cfg.backend == Backend::Cuda {
        out.push(
            Issue::new(
                FIELD,
                format!(
                    "the cuda backend runs one GPU per worker for now: set \
                     tensor_parallel_size to 1 (or use `backend: model`), got {n}"
                ),
            )
            .with_related("backend"),
        );
    }
}

fn last(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

fn timing(cfg: &Config, out: &mut Vec<Issue>) {
    let t = &cfg.timing;
    let max = MAX_TIMING_UNIT;
    if !(t.base_ms.is_finite() && t.base_ms > 0.0 && t.base_ms <= max) {
        out.push(Issue::new(
            "timing.base_ms",
            format!("must be a finite number in (0, {max}], got {}", t.base_ms),
        ));
    }
    finite_within(out, "timing.per_request_ms", t.per_request_ms, 0.0, max);
    finite_within(out, "timing.per_kv_token_ns", t.per_kv_token_ns, 0.0, max);
    finite_within(out, "timing.jump_ms", t.jump_ms, 0.0, max);
    finite_within(
        out,
        "timing.per_request_above_ms",
        t.per_request_above_ms,
        0.0,
        max,
    );
    finite_within(
        out,
        "timing.tokens_per_step",
        t.tokens_per_step,
        1.0,
        MAX_TOKENS_PER_STEP,
    );
    finite_within(out, "timing.transfer_base_ms", t.transfer_base_ms, 0.0, max);
    finite_within(
        out,
        "timing.transfer_per_token_us",
        t.transfer_per_token_us,
        0.0,
        max,
    );
    finite_within(
        out,
        "timing.prefill_per_token_us",
        t.prefill_per_token_us,
        0.0,
        max,
    );
}

/// An address `serve` can bind: an IP literal (IPv6 in brackets or bare), or a DNS name of
/// labels of letters, digits and `-` (RFC 1123), each 1 to 63 long, 253 in all.
fn is_host(h: &str) -> bool {
    let bare = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = h.strip_suffix('.').unwrap_or(h);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn server(cfg: &Config, out: &mut Vec<Issue>) {
    let s = &cfg.server;
    if s.host.trim().is_empty() {
        out.push(Issue::new("server.host", "must not be empty"));
    } else if !is_host(&s.host) {
        out.push(Issue::new(
            "server.host",
            format!(
                "`{}` is neither an IP address nor a host name (letters, digits, `-` and `.`)",
                s.host
            ),
        ));
    }
    seconds(out, "server.stat_interval_s", s.stat_interval_s);
    seconds(out, "server.request_timeout_s", s.request_timeout_s);
    in_range(
        out,
        "server.default_max_tokens",
        u64::from(s.default_max_tokens),
        MAX_CONTEXT_TOKENS,
    );
    seconds(out, "server.drain_timeout_s", s.drain_timeout_s);
    seconds(out, "server.header_read_timeout_s", s.header_read_timeout_s);
    seconds(out, "server.body_read_timeout_s", s.body_read_timeout_s);
    in_range(
        out,
        "server.max_connections",
        u64::from(s.max_connections),
        MAX_CONNECTIONS,
    );
    in_range(
        out,
        "server.max_body_bytes",
        s.max_body_bytes,
        MAX_BODY_BYTES,
    );
    seconds(out, "server.arrival_horizon_s", s.arrival_horizon_s);
    if let Some(name) = &s.served_model_name {
        model_name(out, "server.served_model_name", name);
    }
    for (i, alias) in s.model_aliases.iter().enumerate() {
        model_name(out, &format!("server.model_aliases[{i}]"), alias);
    }
}

fn model_name(out: &mut Vec<Issue>, field: &str, name: &str) {
    if name.trim().is_empty() || name.chars().any(char::is_control) {
        out.push(Issue::new(
            field,
            format!("must be a non-empty name without control characters, got {name:?}"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_an_ip_address_or_a_host_name() {
        for ok in [
            "127.0.0.1",
            "0.0.0.0",
            "::",
            "[::1]",
            "localhost",
            "gen-worker-3.cluster.local",
            "gen-worker-3.cluster.local.",
        ] {
            assert!(is_host(ok), "{ok}");
        }
        for bad in [
            "not a host!!",
            "http://127.0.0.1",
            "127.0.0.1:8000",
            "-lead",
            "a..b",
            "under_score",
        ] {
            assert!(!is_host(bad), "{bad}");
        }
        let mut cfg = Config::default();
        cfg.server.host = "not a host!!".into();
        assert_eq!(
            issues(&cfg)
                .iter()
                .map(|i| i.field.as_str())
                .collect::<Vec<_>>(),
            ["server.host"]
        );
    }

    #[test]
    fn the_built_in_defaults_break_no_rule() {
        assert_eq!(issues(&Config::default()), Vec::new());
        assert_eq!(issues(&Config::default().resolved()), Vec::new());
    }

    #[test]
    fn drafting_needs_slots_a_window_for_key_and_draft_and_no_hybrid_shape() {
        let fields = |f: &dyn Fn(&mut Config)| {
            let mut cfg = Config::default();
            f(&mut cfg);
            issues(&cfg)
                .into_iter()
                .map(|i| i.field)
                .collect::<Vec<_>>()
        };
        let ok = |c: &mut Config| {
            c.drafter.slots = Some(176);
            c.drafter.window_tokens = 64;
            c.drafter.max_draft_len = 4;
        };
        assert!(fields(&ok).is_empty());
        assert_eq!(
            fields(&|c| {
                ok(c);
                c.drafter.window_tokens = 6;
            }),
            ["drafter.window_tokens"]
        );
        assert_eq!(
            fields(&|c| {
                ok(c);
                c.drafter.slots = None;
                c.drafter.max_draft_len = MAX_DRAFT_LEN + 1;
            }),
            ["drafter.max_draft_len", "drafter.max_draft_len"]
        );
        assert_eq!(
            fields(&|c| c.model.shape = Some("tiny-hybrid".into())),
            ["recurrent_state.slots"]
        );
        assert_eq!(
            fields(&|c| {
                ok(c);
                c.model.shape = Some("llama-hybrid-1b".into());
                c.recurrent_state.slots = Some(176);
            }),
            ["drafter.max_draft_len"]
        );
    }

    #[test]
    fn zero_samples_or_an_empty_window_cannot_form_x() {
        let mut cfg = Config::default();
        cfg.scheduler_config.gen_admission.min_samples = 0;
        let fields: Vec<String> = issues(&cfg).into_iter().map(|i| i.field).collect();
        assert_eq!(fields, ["scheduler_config.gen_admission.min_samples"]);

        let mut cfg = Config::default();
        cfg.scheduler_config.gen_admission.target_window = 0;
        let fields: Vec<String> = issues(&cfg).into_iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            [
                "scheduler_config.gen_admission.target_window",
                "scheduler_config.gen_admission.min_samples"
            ]
        );
    }

    #[test]
    fn several_ranks_run_on_the_model_backend_and_are_refused_on_cuda() {
        let fields = |backend, n| {
            let mut cfg = Config {
                backend,
                ..Config::default()
            };
            cfg.parallel.tensor_parallel_size = n;
            issues(&cfg)
                .into_iter()
                .map(|i| (i.field, i.related))
                .collect::<Vec<_>>()
        };
        let tp = || "parallel.tensor_parallel_size".to_owned();
        assert_eq!(fields(Backend::Model, 4), []);
        assert_eq!(fields(Backend::Model, MAX_TENSOR_PARALLEL), []);
        assert_eq!(
            fields(Backend::Model, MAX_TENSOR_PARALLEL + 1),
            [(tp(), vec![])]
        );
        assert_eq!(fields(Backend::Cuda, 1), []);
        assert_eq!(
            fields(Backend::Cuda, 2),
            [(tp(), vec!["backend".to_owned()])]
        );
        assert_eq!(fields(Backend::Model, 0), [(tp(), vec![])]);
    }

    #[test]
    fn an_initial_gain_needs_tpot_budget_and_a_value_within_gs_range() {
        let issue = |budget: Option<f64>, target: Option<f64>, gain: f64| {
            let mut cfg = Config::default();
            let p = &mut cfg.scheduler_config.gen_preemption;
            (p.tpot_budget, p.target_output_tps, p.initial_gain) = (budget, target, Some(gain));
            issues(&cfg)
                .into_iter()
                .map(|i| (i.field, i.related, i.message))
                .collect::<Vec<_>>()
        };
        assert_eq!(issue(Some(0.1), None, 0.25), []);
        assert_eq!(issue(Some(0.1), None, 2.0), []);
        for bad in [0.2, 2.5, f64::NAN] {
            let found = issue(Some(0.1), None, bad);
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert_eq!(found[0].0, INITIAL_GAIN);
            assert!(found[0].2.contains("[0.25, 2]"), "{found:?}");
        }
        let off = issue(None, None, 0.5);
        assert_eq!(
            (off[0].0.as_str(), off[0].1.clone()),
            (INITIAL_GAIN, vec![TPOT_BUDGET.to_owned()])
        );
        let target = issue(None, Some(20.0), 0.5);
        assert_eq!(target[0].1, [TARGET_TPS]);
        assert!(
            target[0].2.contains("with `tpot_budget` only"),
            "{target:?}"
        );
    }

    #[test]
    fn gain_from_needs_tpot_budget() {
        let issue = |budget: Option<f64>, target: Option<f64>| {
            let mut cfg = Config::default();
            let p = &mut cfg.scheduler_config.gen_preemption;
            (p.tpot_budget, p.target_output_tps) = (budget, target);
            p.gain_from = Some(crate::config::GainFrom::Paused);
            issues(&cfg)
                .into_iter()
                .map(|i| (i.field, i.related))
                .collect::<Vec<_>>()
        };
        assert_eq!(issue(Some(0.1), None), []);
        assert_eq!(
            issue(None, None),
            [(GAIN_FROM.to_owned(), vec![TPOT_BUDGET.to_owned()])]
        );
        assert_eq!(
            issue(None, Some(20.0)),
            [(GAIN_FROM.to_owned(), vec![TARGET_TPS.to_owned()])]
        );
    }

    #[test]
    fn preemption_mode_follows_the_one_field_set() {
        let mut cfg = Config::default();
        assert_eq!(preemption_mode(&cfg), Ok(Preemption::Off));
        cfg.scheduler_config.gen_preemption.target_output_tps = Some(20.0);
        assert_eq!(preemption_mode(&cfg), Ok(Preemption::TargetOutputTps(20.0)));
        cfg.scheduler_config.gen_preemption.tpot_budget = Some(0.2);
        let issue = preemption_mode(&cfg).expect_err("both set");
        assert_eq!(issue.field, TPOT_BUDGET);
        assert_eq!(issue.related, [TARGET_TPS]);
    }
}

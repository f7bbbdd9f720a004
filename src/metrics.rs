//! Every Prometheus metric genslot exports, in the peers' vocabulary (vLLM / Dynamo) with a
//! `genslot_` prefix, and the recorder that renders them for `GET /metrics`.
//!
//! Who records what: the HTTP layer records per-request latency (TTFT, TPOT, E2E), token
//! counts, successes and rejections; the engine records the scheduler's gauges and counters
//! (running / waiting / paused, pauses, resumes, queue time, pools).

use std::sync::Mutex;
use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge: requests in the batch or holding a slot (active). Engine.
pub const NUM_REQUESTS_RUNNING: &str = "genslot_num_requests_running";
/// Gauge: requests in the admission queue. Engine.
pub const NUM_REQUESTS_WAITING: &str = "genslot_num_requests_waiting";
/// Gauge: requests paused in place by the preemption controller. Engine.
pub const NUM_REQUESTS_PAUSED: &str = "genslot_num_requests_paused";
/// Counter: pauses decided by the preemption controller. Engine.
pub const PAUSES_TOTAL: &str = "genslot_pauses_total";
/// Counter, label [`LABEL_FORCED`] = [`FORCED_YES`] | [`FORCED_NO`]: resumes of paused requests. Engine.
pub const RESUMES_TOTAL: &str = "genslot_resumes_total";
/// Counter: batch rows left out of a pass because their decode growth found no free KV page
/// (they wait; a count that climbs while nothing completes is a KV pool that cannot serve).
/// Engine.
pub const KV_WAITS_TOTAL: &str = "genslot_kv_waits_total";
/// Counter: requests aborted because every running row waited for a KV page and none could
/// step (`policy::kv_stall`): the pool is too small for the load. Engine.
pub const KV_ABORTS_TOTAL: &str = "genslot_kv_aborts_total";
/// Counter: requests cancelled (client gone or timed out) while paused in place: what
/// pausing cost beyond the TPOT it adds. Engine.
pub const CANCELLED_WHILE_PAUSED_TOTAL: &str = "genslot_requests_cancelled_while_paused_total";
/// Histogram (s): first token − arrival. HTTP layer.
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "genslot_time_to_first_token_seconds";
/// Histogram (s): (finish − first token) / (output tokens − 1). HTTP layer.
pub const TIME_PER_OUTPUT_TOKEN_SECONDS: &str = "genslot_time_per_output_token_seconds";
/// Histogram (s): arrival → admission into a slot. Engine.
pub const REQUEST_QUEUE_TIME_SECONDS: &str = "genslot_request_queue_time_seconds";
/// Histogram (s): admission → the request's context on this worker (KV transfer or
/// prefill), what the scheduler's s2f learns. Engine.
pub const CONTEXT_ARRIVAL_SECONDS: &str = "genslot_context_arrival_seconds";
/// Histogram (s): arrival → last token. HTTP layer.
pub const E2E_REQUEST_LATENCY_SECONDS: &str = "genslot_e2e_request_latency_seconds";
/// Gauge, label [`LABEL_POOL`]: units of the pool in use. Engine.
pub const POOL_USED: &str = "genslot_pool_used";
/// Gauge, label [`LABEL_POOL`]: units the pool holds, [`POOL_HEADROOM`] included. Engine.
pub const POOL_CAPACITY: &str = "genslot_pool_capacity";
/// Gauge, label [`LABEL_POOL`]: units held back for paused requests (SPEC §4.5), so that
/// admission sees capacity − headroom. Engine.
pub const POOL_HEADROOM: &str = "genslot_pool_headroom";
/// Counter, label [`LABEL_FINISHED_REASON`] = one of [`FINISHED_REASONS`]. HTTP layer.
pub const REQUEST_SUCCESS_TOTAL: &str = "genslot_request_success_total";
/// Counter, label [`LABEL_REASON`] = the error code (e.g. "queue_full", "invalid_json"). HTTP layer.
pub const REQUESTS_REJECTED_TOTAL: &str = "genslot_requests_rejected_total";
/// Counter, label [`LABEL_REASON`] = [`FAILED_ENGINE`] | [`FAILED_TIMEOUT`] |
/// [`FAILED_CANCELLED`]: accepted
/// requests that ended without a finish reason (engine failure or shutdown, past
/// `server.request_timeout_s`, or the client went away). HTTP layer.
pub const REQUESTS_FAILED_TOTAL: &str = "genslot_requests_failed_total";
/// Counter: prompt tokens of accepted requests. HTTP layer.
pub const PROMPT_TOKENS_TOTAL: &str = "genslot_prompt_tokens_total";
/// Counter: tokens sent to clients. HTTP layer.
pub const GENERATION_TOKENS_TOTAL: &str = "genslot_generation_tokens_total";
/// A decode step as the backend timed it (its rows in, their tokens out).
pub const STEP_SECONDS: &str = "genslot_step_seconds";
/// Between steps while the batch stays non-empty: a step's tokens reaching the executor to
/// the next step's dispatch (the scheduling pass and the executor's bookkeeping). With
/// [`STEP_SECONDS`] it splits the served inter-token interval into the GPU's part and ours.
pub const STEP_GAP_SECONDS: &str = "genslot_step_gap_seconds";

pub const LABEL_FORCED: &str = "forced";
pub const LABEL_POOL: &str = "pool";
pub const LABEL_FINISHED_REASON: &str = "finished_reason";
pub const LABEL_REASON: &str = "reason";

/// [`LABEL_FORCED`] values: a forced resume (SPEC §4.3: paused for the maximum pause, or in
/// `target_output_tps` mode a slack down to 0.01 D) or a regular one.
pub const FORCED_YES: &str = "true";
pub const FORCED_NO: &str = "false";
/// [`LABEL_FINISHED_REASON`] values: OpenAI's `finish_reason`s, "abort" (vLLM's) for a
/// request the engine ended.
pub const FINISHED_REASONS: &[&str] = &["length", "stop", "abort"];
/// [`LABEL_REASON`] values of [`REQUESTS_FAILED_TOTAL`].
pub const FAILED_ENGINE: &str = "engine_failed";
pub const FAILED_TIMEOUT: &str = "timeout";
pub const FAILED_CANCELLED: &str = "cancelled";

// Bucket bounds hold every one of vLLM's, so a dashboard's `le` selectors built for vLLM
// still match, and add bounds where the scheduler works: TTFT at most 25 % apart from 0.1 s
// to 40 s, where X sits (vLLM's jump from 10 s to 20 s); TPOT at most 12.5 % apart from 5 ms
// to 200 ms, where a GPU's steps and a TPOT budget of a few percent sit (vLLM's put every
// decode step of one server in one or two buckets); queue time down to a millisecond.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4,
    0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0,
    7.5, 8.0, 9.0, 10.0, 12.5, 15.0, 17.5, 20.0, 25.0, 30.0, 35.0, 40.0, 80.0, 160.0, 640.0,
    2560.0,
];
pub const TPOT_BUCKETS: &[f64] = &[
    0.005, 0.0055, 0.006, 0.0065, 0.007, 0.0075, 0.008, 0.009, 0.01, 0.011, 0.012, 0.0135, 0.015,
    0.0165, 0.018, 0.02, 0.0225, 0.025, 0.0275, 0.03, 0.033, 0.036, 0.04, 0.044, 0.048, 0.05,
    0.055, 0.06, 0.065, 0.07, 0.075, 0.08, 0.09, 0.1, 0.11, 0.12, 0.135, 0.15, 0.165, 0.18, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// For queue time and E2E latency.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0,
    5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

/// For a step and the gap between steps: 0.1 ms to 1 s.
pub const STEP_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03,
    0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];

/// How often [`spawn_upkeep`] drains histogram samples so memory stays bounded between scrapes.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot install the Prometheus recorder: {0}")]
    Install(#[from] BuildError),
}

fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(TIME_TO_FIRST_TOKEN_SECONDS.into()),
            TTFT_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(TIME_PER_OUTPUT_TOKEN_SECONDS.into()),
            TPOT_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(REQUEST_QUEUE_TIME_SECONDS.into()),
            REQUEST_LATENCY_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full(CONTEXT_ARRIVAL_SECONDS.into()), TTFT_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(E2E_REQUEST_LATENCY_SECONDS.into()),
            REQUEST_LATENCY_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full(STEP_SECONDS.into()), STEP_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(STEP_GAP_SECONDS.into()), STEP_BUCKETS)
}

static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the process-wide recorder (once; later calls return the same handle), describes
/// every metric, and registers the unlabelled ones at zero so a scrape shows them from the
/// start. Fails only if a different recorder was installed first.
pub fn install_recorder() -> Result<PrometheusHandle, MetricsError> {
    let mut installed = INSTALLED
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = builder()?.install_recorder()?;
    describe_all();
    register_at_zero();
    *installed = Some(handle.clone());
    Ok(handle)
}

/// Keeps histogram memory bounded when nobody scrapes; call inside a tokio runtime.
pub fn spawn_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

fn describe_all() {
    describe_gauge!(
        NUM_REQUESTS_RUNNING,
        "Requests holding a slot (active, not paused)."
    );
    describe_gauge!(NUM_REQUESTS_WAITING, "Requests in the admission queue.");
    describe_gauge!(
        NUM_REQUESTS_PAUSED,
        "Requests paused in place by the preemption controller."
    );
    describe_counter!(PAUSES_TOTAL, "Pauses decided by the preemption controller.");
    describe_counter!(
        KV_WAITS_TOTAL,
        "Batch rows left out of a pass because their decode growth found no free KV page."
    );
    describe_counter!(
        KV_ABORTS_TOTAL,
        "Requests aborted because every running row waited for a KV page (the newest admission gives up its pages so the others can finish)."
    );
    describe_counter!(
        RESUMES_TOTAL,
        "Resumes of paused requests; forced=true when the pause ended regardless of free slots (the maximum pause, or in target mode a slack at 0.01 D)."
    );
    describe_counter!(
        CANCELLED_WHILE_PAUSED_TOTAL,
        "Requests cancelled (client gone, or timed out) while paused in place."
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN_SECONDS,
        Unit::Seconds,
        "First token time minus arrival (arrival_time when the request carries it)."
    );
    describe_histogram!(
        TIME_PER_OUTPUT_TOKEN_SECONDS,
        Unit::Seconds,
        "(Finish - first token) / (output tokens - 1), pauses included."
    );
    describe_histogram!(
        REQUEST_QUEUE_TIME_SECONDS,
        Unit::Seconds,
        "Arrival to admission into a slot."
    );
    describe_histogram!(
        CONTEXT_ARRIVAL_SECONDS,
        Unit::Seconds,
        "Admission to the request's context (KV transfer or prefill) on this worker."
    );
    describe_histogram!(
        E2E_REQUEST_LATENCY_SECONDS,
        Unit::Seconds,
        "Arrival to the last token."
    );
    describe_histogram!(
        STEP_SECONDS,
        Unit::Seconds,
        "A decode step as the backend timed it: its rows in, their tokens out."
    );
    describe_histogram!(
        STEP_GAP_SECONDS,
        Unit::Seconds,
        "A step's tokens back at the executor to the next step's dispatch, while the batch stays non-empty."
    );
    describe_gauge!(POOL_USED, "Units of the pool in use.");
    describe_gauge!(
        POOL_CAPACITY,
        "Units the pool holds, the paused requests' headroom included."
    );
    describe_gauge!(
        POOL_HEADROOM,
        "Units held back for paused requests; admission sees capacity minus headroom."
    );
    describe_counter!(
        REQUEST_SUCCESS_TOTAL,
        "Requests that finished, by finished_reason."
    );
    describe_counter!(
        REQUESTS_REJECTED_TOTAL,
        "Requests refused before or at submission, by reason."
    );
    describe_counter!(
        REQUESTS_FAILED_TOTAL,
        "Accepted requests that ended without finishing (engine failure, client gone), by reason."
    );
    describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens of accepted requests.");
    describe_counter!(GENERATION_TOKENS_TOTAL, "Tokens sent to clients.");
}

fn register_at_zero() {
    for name in [
        NUM_REQUESTS_RUNNING,
        NUM_REQUESTS_WAITING,
        NUM_REQUESTS_PAUSED,
    ] {
        gauge!(name).set(0.0);
    }
    for name in [
        PAUSES_TOTAL,
        KV_WAITS_TOTAL,
        KV_ABORTS_TOTAL,
        CANCELLED_WHILE_PAUSED_TOTAL,
        PROMPT_TOKENS_TOTAL,
        GENERATION_TOKENS_TOTAL,
    ] {
        counter!(name).increment(0);
    }
    for forced in [FORCED_YES, FORCED_NO] {
        counter!(RESUMES_TOTAL, LABEL_FORCED => forced).increment(0);
    }
    for &reason in FINISHED_REASONS {
        counter!(REQUEST_SUCCESS_TOTAL, LABEL_FINISHED_REASON => reason).increment(0);
    }
    for reason in [FAILED_ENGINE, FAILED_TIMEOUT, FAILED_CANCELLED] {
        counter!(REQUESTS_FAILED_TOTAL, LABEL_REASON => reason).increment(0);
    }
    // A histogram with no sample yet still renders its buckets at zero once registered.
    for name in [
        TIME_TO_FIRST_TOKEN_SECONDS,
        TIME_PER_OUTPUT_TOKEN_SECONDS,
        REQUEST_QUEUE_TIME_SECONDS,
        CONTEXT_ARRIVAL_SECONDS,
        E2E_REQUEST_LATENCY_SECONDS,
    ] {
        let _ = histogram!(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_as_buckets_not_summaries() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!(TIME_TO_FIRST_TOKEN_SECONDS).record(0.03);
            metrics::histogram!(E2E_REQUEST_LATENCY_SECONDS).record(3.0);
        });
        let text = handle.render();
        assert!(text.contains(r#"genslot_time_to_first_token_seconds_bucket{le="0.04"} 1"#));
        assert!(text.contains(r#"genslot_time_to_first_token_seconds_bucket{le="0.02"} 0"#));
        assert!(text.contains(r#"genslot_e2e_request_latency_seconds_bucket{le="5"} 1"#));
        assert!(!text.contains("quantile="));
    }

    /// A dashboard or an `absent()` alert finds every family §7 names on a fresh server.
    #[test]
    fn a_fresh_server_shows_the_latency_histograms_and_outcome_counters_at_zero() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, register_at_zero);
        let text = handle.render();
        for line in [
            r#"genslot_time_to_first_token_seconds_bucket{le="+Inf"} 0"#,
            r#"genslot_time_per_output_token_seconds_count 0"#,
            r#"genslot_request_queue_time_seconds_count 0"#,
            r#"genslot_request_success_total{finished_reason="abort"} 0"#,
            r#"genslot_requests_failed_total{reason="cancelled"} 0"#,
            "genslot_requests_cancelled_while_paused_total 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    /// vLLM's bounds (its `metrics.py`), kept so that a dashboard built for vLLM still
    /// finds every `le` it selects.
    const VLLM_TTFT: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
    const VLLM_TPOT: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];
    const VLLM_LATENCY: &[f64] = &[
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0, 1920.0, 7680.0,
    ];

    #[test]
    fn every_vllm_bound_is_kept() {
        for (ours, theirs) in [
            (TTFT_BUCKETS, VLLM_TTFT),
            (TPOT_BUCKETS, VLLM_TPOT),
            (REQUEST_LATENCY_BUCKETS, VLLM_LATENCY),
        ] {
            for b in theirs {
                assert!(ours.contains(b), "vLLM's bound {b} is missing");
            }
        }
    }

    /// Where the scheduler works, a bucket is narrow: a TTFT against X of 0.1–40 s within
    /// 25 %, a TPOT of 5–200 ms within 12.5 % (a budget of a few percent moves the mean).
    #[test]
    fn where_the_scheduler_works_buckets_are_narrow() {
        let check = |bounds: &[f64], lo: f64, hi: f64, ratio: f64| {
            for w in bounds.windows(2).filter(|w| w[0] >= lo && w[1] <= hi) {
                assert!(w[1] <= w[0] * ratio + 1e-12, "{} to {}", w[0], w[1]);
            }
            assert!(bounds.contains(&lo) && bounds.contains(&hi));
        };
        check(TTFT_BUCKETS, 0.1, 40.0, 1.25);
        check(TPOT_BUCKETS, 0.005, 0.2, 1.125);
    }

    #[test]
    fn every_name_has_the_prefix_and_bucket_bounds_ascend() {
        let all = [
            NUM_REQUESTS_RUNNING,
            NUM_REQUESTS_WAITING,
            NUM_REQUESTS_PAUSED,
            PAUSES_TOTAL,
            RESUMES_TOTAL,
            KV_WAITS_TOTAL,
            KV_ABORTS_TOTAL,
            CANCELLED_WHILE_PAUSED_TOTAL,
            TIME_TO_FIRST_TOKEN_SECONDS,
            TIME_PER_OUTPUT_TOKEN_SECONDS,
            REQUEST_QUEUE_TIME_SECONDS,
            CONTEXT_ARRIVAL_SECONDS,
            E2E_REQUEST_LATENCY_SECONDS,
            STEP_SECONDS,
            STEP_GAP_SECONDS,
            POOL_USED,
            POOL_CAPACITY,
            POOL_HEADROOM,
            REQUEST_SUCCESS_TOTAL,
            REQUESTS_REJECTED_TOTAL,
            REQUESTS_FAILED_TOTAL,
            PROMPT_TOKENS_TOTAL,
            GENERATION_TOKENS_TOTAL,
        ];
        assert!(all.iter().all(|n| n.starts_with("genslot_")));
        for bounds in [
            TTFT_BUCKETS,
            TPOT_BUCKETS,
            REQUEST_LATENCY_BUCKETS,
            STEP_BUCKETS,
        ] {
            assert!(
                bounds.windows(2).all(|w| w[0] < w[1]),
                "buckets must ascend"
            );
        }
    }
}

//! The run summary: AIPerf-named statistics over the measured (non-warm-up) requests, error
//! counts by kind, and the server's own counters when it exposes them.
//!
//! Every measured request ends in exactly one of three counts. `request_count` is the
//! requests that completed successfully, as AIPerf's `request_count` counts valid requests;
//! `error_request_count` the ones that failed; `cancelled_request_count` the ones loadgen
//! cancelled because they were still in flight when the run ended.
//!
//! As in AIPerf, which computes its per-request metrics over valid records only, every
//! statistic named as one of AIPerf's covers the completed requests, the set `request_count`
//! counts: the latency distributions, `output_sequence_length` and `total_osl`,
//! `input_sequence_length` and `total_isl`, and `benchmark_duration` (AIPerf's
//! `max_response_timestamp − min_request_timestamp`: from the first completed request's send
//! to the last one's end), hence both throughputs: `request_throughput` is
//! `request_count / benchmark_duration`. The failed requests' prompts are in `error_isl` and
//! `total_error_isl` (AIPerf's names), their kinds in `errors_by_kind`. There is no
//! `good_request_count`: in AIPerf that is goodput against user SLOs, which loadgen does not
//! take. `--duration` bounds only when new requests are sent; `wall_time_s` is the whole run,
//! warm-up, grace and cancellation included.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::record::{Outcome, RequestRecord};
use crate::scrape::ServerDelta;
use crate::stats::{Scalar, Stat};

/// Why the run stopped issuing requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Duration,
    MaxRequests,
    SourceExhausted,
    /// Ctrl-C or SIGTERM: the summary covers the part that ran.
    Interrupted,
}

/// What was run, for the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub url: String,
    pub endpoint: String,
    pub model: String,
    pub source: String,
    pub concurrency: Option<usize>,
    pub rate_scale: f64,
    pub seed: u64,
    pub duration_limit_s: f64,
    pub max_requests: Option<u64>,
    /// Closed loop: upper bound of the per-send jitter (0 = back to back). Absent in
    /// summaries written before the jitter existed.
    #[serde(default)]
    pub send_jitter_ms: f64,
    /// Open-loop Poisson arrivals at this many requests per second (`--request-rate`);
    /// `concurrency` is then a cap on requests in flight, not a number of lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<f64>,
}

/// The current [`Summary::loadgen_summary_version`].
pub const SUMMARY_VERSION: u32 = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// 3: the counts and sets as described in this module. 2 had the same counts, but its
    /// `input_sequence_length` and `total_isl` covered failed and cancelled requests too, and
    /// its `benchmark_duration` ran from the first measured send (whatever became of it) to
    /// the last completion or failure. Summaries written before the field existed (read as
    /// version 1) counted every measured request sent in `request_count` and the completed
    /// ones in `good_request_count`; the oldest of them also counted run-end cancellations
    /// in `error_request_count` (as `errors_by_kind.cancelled`). `loadgen compare` reads
    /// them all.
    #[serde(default = "first_version")]
    pub loadgen_summary_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_first_token: Option<Stat>,
    /// Per request: (latency − TTFT) / (output tokens − 1), i.e. TPOT.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inter_token_latency: Option<Stat>,
    /// Every gap between consecutive content chunks, pooled over requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inter_chunk_latency: Option<Stat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_latency: Option<Stat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_sequence_length: Option<Stat>,
    /// Prompt lengths of the completed requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_sequence_length: Option<Stat>,
    /// Prompt lengths of the failed requests (absent when none failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_isl: Option<Stat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_token_throughput_per_user: Option<Stat>,
    pub output_token_throughput: Scalar,
    pub request_throughput: Scalar,
    pub benchmark_duration: Scalar,
    /// Measured requests that completed successfully (AIPerf's valid requests).
    pub request_count: Scalar,
    /// Measured requests that failed (server or network errors, timeouts); run-end
    /// cancellations are not errors.
    pub error_request_count: Scalar,
    /// Measured requests still in flight at the end of the run, cancelled by loadgen.
    #[serde(default = "no_requests")]
    pub cancelled_request_count: Scalar,
    /// Prompt tokens of the completed requests.
    pub total_isl: Scalar,
    /// Output tokens of the completed requests.
    pub total_osl: Scalar,
    /// Prompt tokens of the failed requests (absent when none failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_error_isl: Option<Scalar>,
    /// Failed measured requests by kind (`http_500`, `connect`, `dropped_stream`, `timeout`,
    /// `stream_error`); cancellations are in `cancelled_request_count`.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// The first failed request's message of each kind (the server's `error.message` where
    /// it sent one), so the table says why and not only how many.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub error_examples: BTreeMap<String, String>,
    /// Warm-up requests sent but left out of every statistic above.
    pub warmup_excluded: u64,
    /// Arrivals dropped unsent because the concurrency cap was in flight (`--request-rate`
    /// with `--concurrency`, as AIPerf does).
    #[serde(default)]
    pub arrivals_skipped: u64,
    pub warmup_errors: u64,
    /// True when requests were still in flight at the end and were cancelled.
    pub was_cancelled: bool,
    pub stop_reason: StopReason,
    /// Wall time of the whole run: from its start (warm-up included) to the last response or
    /// cancellation. Not the run's duration: that is `benchmark_duration`.
    pub wall_time_s: f64,
    /// genslot counters over the run, when the server exposes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_metrics: Option<ServerDelta>,
    pub run: RunInfo,
}

/// An error's text for the table: the server's `message` when the text is its JSON error
/// object (a stream's error event, an HTTP error body), else the text as it is.
fn server_message(text: &str) -> String {
    let v: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let message = v.as_ref().and_then(|v| {
        let v = v.get("error").unwrap_or(v);
        v.get("message")?.as_str().map(str::to_owned)
    });
    message.unwrap_or_else(|| text.to_owned())
}

/// At most `n` characters of `s`, an ellipsis marking a cut.
fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

fn first_version() -> u32 {
    1
}

fn no_requests() -> Scalar {
    Scalar::new("requests", 0.0)
}

fn cancelled(r: &RequestRecord) -> bool {
    r.outcome() == Outcome::Cancelled
}

impl Summary {
    pub fn from_records(
        records: &[RequestRecord],
        stop_reason: StopReason,
        wall_time_s: f64,
        server_metrics: Option<ServerDelta>,
        run: RunInfo,
    ) -> Self {
        let measured: Vec<&RequestRecord> = records.iter().filter(|r| !r.warmup).collect();
        let completed: Vec<&RequestRecord> = measured.iter().copied().filter(|r| r.ok()).collect();
        let n_cancelled = measured.iter().filter(|r| cancelled(r)).count();
        let failed: Vec<&RequestRecord> = measured
            .iter()
            .copied()
            .filter(|r| r.outcome() == Outcome::Failed)
            .collect();
        let mut errors_by_kind = BTreeMap::new();
        let mut error_examples = BTreeMap::new();
        for e in failed.iter().filter_map(|r| r.error.as_ref()) {
            *errors_by_kind.entry(e.key()).or_insert(0u64) += 1;
            error_examples
                .entry(e.key())
                .or_insert_with(|| server_message(&e.message));
        }
        // AIPerf's min_request_timestamp and max_response_timestamp, over valid records.
        let window_start = completed.iter().map(|r| r.start_s).reduce(f64::min);
        let window_end = completed.iter().map(|r| r.end_s).reduce(f64::max);
        let duration = match (window_start, window_end) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => 0.0,
        };
        let isl =
            |rs: &[&RequestRecord]| -> u64 { rs.iter().map(|r| u64::from(r.input_tokens)).sum() };
        let total_osl: u64 = completed.iter().map(|r| u64::from(r.output_tokens())).sum();
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let itl: Vec<f64> = completed
            .iter()
            .filter_map(|r| r.inter_token_latency_ms())
            .collect();
        Self {
            loadgen_summary_version: SUMMARY_VERSION,
            time_to_first_token: Stat::of("ms", completed.iter().filter_map(|r| r.ttft_ms)),
            inter_token_latency: Stat::of("ms", itl.iter().copied()),
            inter_chunk_latency: Stat::of(
                "ms",
                completed
                    .iter()
                    .flat_map(|r| r.chunk_gaps_ms.iter().copied()),
            ),
            request_latency: Stat::of("ms", completed.iter().map(|r| r.latency_ms())),
            output_sequence_length: Stat::of(
                "tokens",
                completed.iter().map(|r| f64::from(r.output_tokens())),
            ),
            input_sequence_length: Stat::of(
                "tokens",
                completed.iter().map(|r| f64::from(r.input_tokens)),
            ),
            error_isl: Stat::of("tokens", failed.iter().map(|r| f64::from(r.input_tokens))),
            output_token_throughput_per_user: Stat::of(
                "tokens/sec/user",
                itl.iter().filter(|v| **v > 0.0).map(|v| 1e3 / v),
            ),
            output_token_throughput: Scalar::new("tokens/sec", per_s(total_osl as f64)),
            request_throughput: Scalar::new("requests/sec", per_s(completed.len() as f64)),
            benchmark_duration: Scalar::new("sec", duration),
            request_count: Scalar::new("requests", completed.len() as f64),
            error_request_count: Scalar::new("requests", failed.len() as f64),
            cancelled_request_count: Scalar::new("requests", n_cancelled as f64),
            total_isl: Scalar::new("tokens", isl(&completed) as f64),
            total_osl: Scalar::new("tokens", total_osl as f64),
            total_error_isl: (!failed.is_empty())
                .then(|| Scalar::new("tokens", isl(&failed) as f64)),
            errors_by_kind,
            error_examples,
            warmup_excluded: (records.len() - measured.len()) as u64,
            arrivals_skipped: 0,
            warmup_errors: records.iter().filter(|r| r.warmup && !r.ok()).count() as u64,
            was_cancelled: records.iter().any(cancelled),
            stop_reason,
            wall_time_s,
            server_metrics,
            run,
        }
    }

    /// A readable table for the terminal.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<34} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "metric", "avg", "p50", "p90", "p99", "min", "max", "std"
        );
        let rows: [(&str, &Option<Stat>); 6] = [
            ("time_to_first_token", &self.time_to_first_token),
            ("inter_token_latency", &self.inter_token_latency),
            ("inter_chunk_latency", &self.inter_chunk_latency),
            ("request_latency", &self.request_latency),
            ("output_sequence_length", &self.output_sequence_length),
            ("input_sequence_length", &self.input_sequence_length),
        ];
        for (name, stat) in rows {
            if let Some(s) = stat {
                let _ = writeln!(
                    out,
                    "{:<34} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                    format!("{name} ({})", s.unit),
                    s.avg,
                    s.p50,
                    s.p90,
                    s.p99,
                    s.min,
                    s.max,
                    s.std
                );
            }
        }
        // Each count and rate says what it counts, so none is read as another.
        let scalars = [
            (
                "output_token_throughput",
                &self.output_token_throughput,
                "output tokens of completed requests / benchmark_duration",
            ),
            (
                "request_throughput",
                &self.request_throughput,
                "completed requests (request_count) / benchmark_duration",
            ),
            (
                "benchmark_duration",
                &self.benchmark_duration,
                "first send to last response of the completed requests",
            ),
            (
                "request_count",
                &self.request_count,
                "completed successfully",
            ),
            (
                "error_request_count",
                &self.error_request_count,
                "failed (by kind below)",
            ),
            (
                "cancelled_request_count",
                &self.cancelled_request_count,
                "still in flight at the run's end, cancelled",
            ),
        ];
        for (name, s, what) in scalars {
            let _ = writeln!(
                out,
                "{:<34} {:>10.2}   {what}",
                format!("{name} ({})", s.unit),
                s.avg
            );
        }
        let _ = writeln!(
            out,
            "{:<34} {:>10}",
            "warmup_excluded", self.warmup_excluded
        );
        if self.arrivals_skipped > 0 {
            let _ = writeln!(
                out,
                "{:<34} {:>10}",
                "arrivals skipped (cap in flight)", self.arrivals_skipped
            );
        }
        for (kind, n) in &self.errors_by_kind {
            let _ = writeln!(out, "{:<34} {:>10}", format!("errors: {kind}"), n);
            if let Some(m) = self.error_examples.get(kind) {
                let _ = writeln!(out, "  first: {}", clip(m, 240));
            }
        }
        if let Some(m) = &self.server_metrics {
            let _ = writeln!(out, "{:<34} {:>10}", "server pauses", m.pauses);
            let _ = writeln!(
                out,
                "{:<34} {:>10}",
                "server resumes (normal)", m.resumes_normal
            );
            let _ = writeln!(
                out,
                "{:<34} {:>10}",
                "server resumes (forced)", m.resumes_forced
            );
        }
        let _ = writeln!(
            out,
            "stopped by {:?}; the whole run (warm-ups and grace included) took {:.1} s{}",
            self.stop_reason,
            self.wall_time_s,
            if self.was_cancelled {
                " and cancelled the requests still in flight at its end"
            } else {
                ""
            }
        );
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::{ErrorKind, RequestError};

    /// A completed request's record.
    pub(crate) fn rec(
        id: u64,
        warmup: bool,
        start_s: f64,
        end_s: f64,
        ttft_ms: f64,
        tokens: u32,
    ) -> RequestRecord {
        RequestRecord {
            id,
            lane: Some(0),
            session: Some(0),
            conversation: Some(0),
            warmup,
            input_tokens: 100,
            max_tokens: tokens,
            scheduled_s: start_s,
            start_s,
            ack_s: Some(start_s),
            end_s,
            ttft_ms: Some(ttft_ms),
            chunk_gaps_ms: vec![],
            content_chunks: tokens,
            usage_output_tokens: Some(tokens),
            error: None,
        }
    }

    /// A run's identity for tests that only read the counts.
    pub(crate) fn info() -> RunInfo {
        RunInfo {
            url: "u".into(),
            endpoint: "completions".into(),
            model: "m".into(),
            source: "s".into(),
            concurrency: Some(1),
            rate_scale: 1.0,
            seed: 0,
            duration_limit_s: 10.0,
            max_requests: None,
            send_jitter_ms: 0.0,
            request_rate: None,
        }
    }

    #[test]
    fn warmups_and_failures_stay_out_of_latency_and_throughput() {
        let mut failed = rec(3, false, 2.0, 6.0, 0.0, 0);
        failed.error = Some(RequestError {
            kind: ErrorKind::Http,
            status: Some(503),
            message: String::new(),
            retry_after_s: None,
        });
        failed.ttft_ms = None;
        let records = vec![
            // A warm-up with an absurd TTFT that must not show anywhere.
            rec(0, true, 0.0, 1.0, 9_999.0, 50),
            // 1 s E2E, 100 ms TTFT, 10 tokens: ITL (1000 - 100) / 9 = 100 ms.
            rec(1, false, 1.0, 2.0, 100.0, 10),
            // 2 s E2E, 200 ms TTFT, 19 tokens: ITL 1800 / 18 = 100 ms.
            rec(2, false, 3.0, 5.0, 200.0, 19),
            failed,
        ];
        let s = Summary::from_records(&records, StopReason::MaxRequests, 6.0, None, info());
        assert_eq!(s.warmup_excluded, 1);
        assert_eq!(s.request_count.avg, 2.0, "the completed requests only");
        assert_eq!(s.error_request_count.avg, 1.0);
        assert_eq!(
            s.errors_by_kind,
            BTreeMap::from([("http_503".to_owned(), 1)])
        );
        let ttft = s.time_to_first_token.unwrap();
        assert_eq!((ttft.min, ttft.max), (100.0, 200.0));
        let itl = s.inter_token_latency.unwrap();
        assert!((itl.avg - 100.0).abs() < 1e-9 && itl.std < 1e-9);
        // Profiling window: first completed send (1 s) to last completed end (5 s) = 4 s; the
        // failure ending at 6 s does not stretch it.
        assert_eq!(s.benchmark_duration.avg, 4.0);
        assert!((s.output_token_throughput.avg - 29.0 / 4.0).abs() < 1e-12);
        assert!((s.request_throughput.avg - 2.0 / 4.0).abs() < 1e-12);
        assert!(!s.was_cancelled);
    }

    #[test]
    fn the_table_shows_each_error_kinds_first_message_the_servers_own_where_it_sent_one() {
        let failure = |id, kind, status, message: &str| {
            let mut r = rec(id, false, 1.0, 2.0, 0.0, 0);
            r.ttft_ms = None;
            r.error = Some(RequestError {
                kind,
                status,
                message: message.to_owned(),
                retry_after_s: None,
            });
            r
        };
        let event = r#"{"message":"the KV cache is full","type":"x","code":"engine_failed"}"#;
        let records = vec![
            failure(1, ErrorKind::StreamError, None, event),
            failure(2, ErrorKind::StreamError, None, "a later one"),
            failure(3, ErrorKind::Http, Some(429), &"q".repeat(300)),
        ];
        let s = Summary::from_records(&records, StopReason::MaxRequests, 3.0, None, info());
        assert_eq!(s.error_examples["stream_error"], "the KV cache is full");
        let table = s.render_table();
        assert!(table.contains("errors: stream_error"), "{table}");
        assert!(table.contains("  first: the KV cache is full\n"), "{table}");
        let clipped = format!("  first: {}…\n", "q".repeat(240));
        assert!(table.contains(&clipped), "{table}");
    }

    #[test]
    fn run_end_cancellations_are_counted_apart_and_do_not_stretch_the_window() {
        let mut cut = rec(2, false, 1.5, 30.0, 0.0, 0);
        cut.error = Some(RequestError {
            kind: ErrorKind::Cancelled,
            status: None,
            message: "cancelled at the end of the run".into(),
            retry_after_s: None,
        });
        cut.ttft_ms = None;
        let records = vec![rec(1, false, 1.0, 3.0, 100.0, 10), cut];
        let s = Summary::from_records(&records, StopReason::Duration, 31.0, None, info());
        assert_eq!(s.error_request_count.avg, 0.0);
        assert_eq!(s.cancelled_request_count.avg, 1.0);
        assert!(s.errors_by_kind.is_empty());
        assert_eq!(
            s.benchmark_duration.avg, 2.0,
            "1 s to 3 s, not to the cancellation"
        );
        assert!(s.was_cancelled);
    }

    #[test]
    fn each_measured_request_lands_in_exactly_one_of_completed_failed_and_cancelled() {
        let mut failed = rec(2, false, 1.0, 2.0, 0.0, 0);
        failed.error = Some(RequestError {
            kind: ErrorKind::Connect,
            status: None,
            message: "connection refused".into(),
            retry_after_s: None,
        });
        let mut cut = rec(3, false, 1.0, 30.0, 0.0, 0);
        cut.error = Some(RequestError {
            kind: ErrorKind::Cancelled,
            status: None,
            message: "cancelled at the end of the run".into(),
            retry_after_s: None,
        });
        let records = vec![
            rec(0, true, 0.0, 1.0, 50.0, 5),
            rec(1, false, 1.0, 5.0, 100.0, 10),
            rec(4, false, 2.0, 5.0, 100.0, 10),
            failed,
            cut.clone(),
            cut,
        ];
        let s = Summary::from_records(&records, StopReason::Duration, 31.0, None, info());
        assert_eq!(s.loadgen_summary_version, SUMMARY_VERSION);
        assert_eq!(s.request_count.avg, 2.0);
        assert_eq!(s.error_request_count.avg, 1.0);
        assert_eq!(s.cancelled_request_count.avg, 2.0);
        // request_throughput is request_count over the window (1 s to 5 s).
        assert!((s.request_throughput.avg - 2.0 / 4.0).abs() < 1e-12);
        let json = serde_json::to_value(&s).unwrap();
        assert!(
            json.get("good_request_count").is_none(),
            "no goodput without SLOs"
        );
        let table = s.render_table();
        let row = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} row in\n{table}"))
                .to_owned()
        };
        assert!(row("request_count").contains("completed"), "{table}");
        assert!(row("request_throughput").contains("completed"), "{table}");
        assert!(
            row("cancelled_request_count").contains("cancelled"),
            "{table}"
        );
    }

    #[test]
    fn prompt_lengths_and_the_window_cover_the_completed_requests_as_request_count_does() {
        let with_isl = |mut r: RequestRecord, isl: u32, kind: Option<ErrorKind>| {
            r.input_tokens = isl;
            if let Some(kind) = kind {
                r.error = Some(RequestError {
                    kind,
                    status: None,
                    message: String::new(),
                    retry_after_s: None,
                });
                r.ttft_ms = None;
            }
            r
        };
        let records = vec![
            // A cancelled request sent first and a failed one ending last: neither is in the
            // window, the prompt lengths or total_isl.
            with_isl(
                rec(9, false, 0.5, 30.0, 0.0, 0),
                9_000,
                Some(ErrorKind::Cancelled),
            ),
            with_isl(rec(1, false, 1.0, 2.0, 100.0, 10), 100, None),
            with_isl(rec(2, false, 2.0, 4.0, 100.0, 10), 300, None),
            with_isl(
                rec(3, false, 3.0, 9.0, 0.0, 0),
                7_000,
                Some(ErrorKind::Connect),
            ),
            with_isl(rec(0, true, 0.0, 1.0, 50.0, 5), 5_000, None),
        ];
        let s = Summary::from_records(&records, StopReason::Duration, 31.0, None, info());
        assert_eq!(s.request_count.avg, 2.0);
        let isl = s.input_sequence_length.as_ref().expect("isl");
        assert_eq!((isl.min, isl.max, isl.avg), (100.0, 300.0, 200.0));
        assert_eq!(s.total_isl.avg, 400.0);
        assert_eq!(s.total_osl.avg, 20.0);
        assert_eq!(s.error_request_count.avg, 1.0);
        assert_eq!(s.error_isl.as_ref().map(|e| e.avg), Some(7_000.0));
        assert_eq!(s.total_error_isl.as_ref().map(|t| t.avg), Some(7_000.0));
        assert_eq!(s.benchmark_duration.avg, 3.0, "1 s to 4 s");
        assert!((s.request_throughput.avg - 2.0 / 3.0).abs() < 1e-12);

        // With no failure there is no error_isl at all, as in AIPerf's export.
        let clean = Summary::from_records(&records[1..3], StopReason::Duration, 5.0, None, info());
        let json = serde_json::to_value(&clean).unwrap();
        assert!(json.get("error_isl").is_none() && json.get("total_error_isl").is_none());
        assert_eq!(json["total_isl"]["avg"], 400.0);
    }

    #[test]
    fn a_summary_without_a_version_reads_as_the_first_format() {
        let mut json = serde_json::to_value(Summary::from_records(
            &[rec(1, false, 1.0, 2.0, 100.0, 10)],
            StopReason::MaxRequests,
            2.0,
            None,
            info(),
        ))
        .unwrap();
        json.as_object_mut()
            .unwrap()
            .remove("loadgen_summary_version");
        let s: Summary = serde_json::from_value(json).unwrap();
        assert_eq!(s.loadgen_summary_version, 1);
    }
}

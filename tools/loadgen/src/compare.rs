//! `loadgen compare A.json B.json`: the main metrics of two runs side by side with their
//! absolute and relative change (B − A).
//!
//! Summaries are read as plain JSON by field path, so AIPerf's `profile_export_aiperf.json`
//! compares too wherever its field names overlap with ours.
//!
//! The request counts are completed (`request_count`, AIPerf's meaning), failed
//! (`error_request_count`) and cancelled at the run's end (`cancelled_request_count`).
//! loadgen summaries written before `loadgen_summary_version` existed counted every request
//! sent in `request_count` and the completed ones in `good_request_count`, and the oldest
//! counted cancellations as errors (`errors_by_kind.cancelled`); they are read in today's
//! terms, and the table says so under a note. Summaries before version 3 timed their
//! throughputs over a window that also spanned failed and cancelled requests; that cannot be
//! recomputed, so when such a run had any, a note says its throughputs are as written.
//!
//! Latencies and throughputs cover a run's completed requests (`request_count`). When a side
//! completed fewer than [`FEW_REQUESTS`], a warning above the table says so; when it completed
//! none, its latencies and throughputs are shown as absent (`-`), not as 0 or a −100 % change.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a JSON summary: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{path} holds none of the compared metrics (time_to_first_token, request_count, ...): \
         not a loadgen or AIPerf summary"
    )]
    NotASummary { path: PathBuf },
}

/// Below this many completed requests on a side, its percentiles rest on a handful of
/// requests, and the table warns that its changes are not reliable.
pub const FEW_REQUESTS: f64 = 30.0;

/// The compared metrics: (label, JSON path).
const METRICS: &[(&str, &[&str])] = &[
    ("TTFT avg (ms)", &["time_to_first_token", "avg"]),
    ("TTFT p50 (ms)", &["time_to_first_token", "p50"]),
    ("TTFT p90 (ms)", &["time_to_first_token", "p90"]),
    ("TTFT p99 (ms)", &["time_to_first_token", "p99"]),
    ("ITL avg (ms)", &["inter_token_latency", "avg"]),
    ("ITL p50 (ms)", &["inter_token_latency", "p50"]),
    ("ITL p90 (ms)", &["inter_token_latency", "p90"]),
    ("ITL p99 (ms)", &["inter_token_latency", "p99"]),
    ("E2E avg (ms)", &["request_latency", "avg"]),
    ("E2E p50 (ms)", &["request_latency", "p50"]),
    ("E2E p90 (ms)", &["request_latency", "p90"]),
    ("E2E p99 (ms)", &["request_latency", "p99"]),
    ("output tokens/s", &["output_token_throughput", "avg"]),
    ("completed requests/s", &["request_throughput", "avg"]),
    ("requests completed", &["request_count", "avg"]),
    ("requests failed", &["error_request_count", "avg"]),
    (
        "requests cancelled at end",
        &["cancelled_request_count", "avg"],
    ),
    ("server pauses", &["server_metrics", "pauses"]),
    (
        "server resumes (normal)",
        &["server_metrics", "resumes_normal"],
    ),
    (
        "server resumes (forced)",
        &["server_metrics", "resumes_forced"],
    ),
];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareRow {
    pub metric: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// b − a, when both exist.
    pub delta: Option<f64>,
    /// 100 × (b − a) / |a|, when both exist and a ≠ 0.
    pub delta_pct: Option<f64>,
}

/// The rows, a warning for each side that completed few or no requests, and a note for each
/// summary read from an older loadgen format (`compare --json` writes all three).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub rows: Vec<CompareRow>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
}

fn lookup(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Whether the metric at `path` is computed over the completed requests (so it means nothing
/// when there were none), rather than being a count.
fn over_completed(path: &[&str]) -> bool {
    !matches!(
        path.first().copied(),
        Some(
            "request_count" | "error_request_count" | "cancelled_request_count" | "server_metrics"
        )
    )
}

/// A warning when side `name` completed fewer than [`FEW_REQUESTS`] requests (`completed`, in
/// today's terms), or does not say how many.
fn few_requests_warning(name: &str, completed: Option<f64>) -> Option<String> {
    match completed {
        None => Some(format!(
            "{name} has no request_count: how many requests its numbers cover is unknown"
        )),
        Some(0.0) => Some(format!(
            "{name} completed no measured request: it measured nothing, so its latencies and \
             throughputs are shown as -, not compared"
        )),
        Some(n) if n < FEW_REQUESTS => Some(format!(
            "{name} completed only {n} measured requests (fewer than {FEW_REQUESTS}): its \
             percentiles and the changes against it are not reliable"
        )),
        Some(_) => None,
    }
}

fn set_count(v: &mut Value, key: &str, n: f64) {
    v[key] = serde_json::json!({"unit": "requests", "avg": n});
}

/// `v` read in today's terms, and a note on what differs, when `v` is an older loadgen summary
/// (it has `warmup_excluded`, which AIPerf's export has not). Other summaries come back
/// unchanged, without a note.
fn in_current_terms(v: &Value) -> (Value, Option<String>) {
    let (out, counts) = counts_in_current_terms(v);
    let window = window_note(v, &out);
    let note = match (counts, window) {
        (Some(c), Some(w)) => Some(format!("{c}; {w}")),
        (c, w) => c.or(w).map(str::to_owned),
    };
    (out, note)
}

/// A note when `v` is a loadgen summary older than version 3 whose run had failed or
/// cancelled requests (`counted` holds its counts in today's terms): its window, and so its
/// throughputs, cannot be recomputed over the completed requests alone.
fn window_note(v: &Value, counted: &Value) -> Option<&'static str> {
    let loadgen = v.get("warmup_excluded").is_some();
    let version = v
        .get("loadgen_summary_version")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let others = ["error_request_count", "cancelled_request_count"]
        .iter()
        .any(|k| lookup(counted, &[k, "avg"]).is_some_and(|n| n > 0.0));
    (loadgen && version < 3 && others).then_some(
        "its throughputs as written, over a window from its first measured send to its last \
         completion or failure (today's runs from the first completed request's send to the \
         last one's end)",
    )
}

/// `v` with its request counts in today's meaning, and what was changed, when `v` is a
/// loadgen summary written before `loadgen_summary_version`. Other summaries come back
/// unchanged.
fn counts_in_current_terms(v: &Value) -> (Value, Option<&'static str>) {
    let legacy = v.get("warmup_excluded").is_some() && v.get("loadgen_summary_version").is_none();
    let Some(completed) = lookup(v, &["good_request_count", "avg"]).filter(|_| legacy) else {
        return (v.clone(), None);
    };
    let mut out = v.clone();
    set_count(&mut out, "request_count", completed);
    if lookup(v, &["cancelled_request_count", "avg"]).is_some() {
        return (
            out,
            Some(
                "completed = its good_request_count (its request_count counted every request sent)",
            ),
        );
    }
    let cancelled = lookup(v, &["errors_by_kind", "cancelled"]).unwrap_or(0.0);
    let errors = lookup(v, &["error_request_count", "avg"]).unwrap_or(0.0);
    set_count(&mut out, "error_request_count", errors - cancelled);
    set_count(&mut out, "cancelled_request_count", cancelled);
    (
        out,
        Some(
            "completed = its good_request_count (its request_count counted every request \
             sent); cancelled = its errors_by_kind.cancelled, taken out of its errors",
        ),
    )
}

/// Rows for every metric present in at least one of the summaries.
pub fn compare_values(a: &Value, b: &Value) -> Comparison {
    let (a, note_a) = in_current_terms(a);
    let (b, note_b) = in_current_terms(b);
    let notes = [("A", note_a), ("B", note_b)]
        .into_iter()
        .filter_map(|(name, note)| {
            note.map(|n| format!("{name} is an older loadgen summary, read as: {n}"))
        })
        .collect();
    let completed = |v: &Value| lookup(v, &["request_count", "avg"]);
    let (n_a, n_b) = (completed(&a), completed(&b));
    let mut warnings: Vec<String> = [("A", n_a), ("B", n_b)]
        .into_iter()
        .filter_map(|(name, n)| few_requests_warning(name, n))
        .collect();
    warnings.extend(unit_warnings(&a, &b));
    warnings.extend(
        [("A", &a), ("B", &b)]
            .into_iter()
            .filter(|(_, v)| v["stop_reason"] == "interrupted")
            .map(|(name, _)| {
                format!(
                    "{name} was interrupted: it covers only the part of its run before the \
                     interrupt"
                )
            }),
    );
    // A side that completed nothing measured nothing: its zero throughputs are not values.
    let value = |v: &Value, n: Option<f64>, path: &[&str]| {
        lookup(v, path).filter(|_| n != Some(0.0) || !over_completed(path))
    };
    let rows = METRICS
        .iter()
        .filter_map(|(label, path)| {
            let (x, y) = (value(&a, n_a, path), value(&b, n_b, path));
            if x.is_none() && y.is_none() {
                return None;
            }
            let delta = x.zip(y).map(|(x, y)| y - x);
            let delta_pct = x
                .zip(y)
                .filter(|(x, _)| *x != 0.0)
                .map(|(x, y)| 100.0 * (y - x) / x.abs());
            Some(CompareRow {
                metric: (*label).to_owned(),
                a: x,
                b: y,
                delta,
                delta_pct,
            })
        })
        .collect();
    Comparison {
        rows,
        warnings,
        notes,
    }
}

/// The latencies are compared in milliseconds, as loadgen and AIPerf write them: a side that
/// says another unit is warned of, not converted.
fn unit_warnings(a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for key in [
        "time_to_first_token",
        "inter_token_latency",
        "request_latency",
    ] {
        for (name, v) in [("A", a), ("B", b)] {
            if let Some(unit) = v[key]["unit"].as_str().filter(|u| *u != "ms") {
                out.push(format!(
                    "{name}'s {key} is in {unit}, not ms: its rows are compared as they are"
                ));
            }
        }
    }
    out
}

/// Whether `v` holds any compared metric (a loadgen or AIPerf summary, old or new).
fn is_summary(v: &Value) -> bool {
    let (v, _) = in_current_terms(v);
    METRICS.iter().any(|(_, path)| lookup(&v, path).is_some())
}

fn read(path: &Path) -> Result<Value, CompareError> {
    let text = std::fs::read_to_string(path).map_err(|source| CompareError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| CompareError::Parse {
        path: path.to_owned(),
        source,
    })
}

pub fn compare_files(a: &Path, b: &Path) -> Result<Comparison, CompareError> {
    let (va, vb) = (read(a)?, read(b)?);
    for (v, path) in [(&va, a), (&vb, b)] {
        if !is_summary(v) {
            return Err(CompareError::NotASummary {
                path: path.to_owned(),
            });
        }
    }
    Ok(compare_values(&va, &vb))
}

/// The table printed by `loadgen compare`, its warnings above it and its notes under it.
pub fn render(comparison: &Comparison, a_name: &str, b_name: &str) -> String {
    let rows = &comparison.rows;
    let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    let mut out = String::new();
    let _ = writeln!(out, "A = {a_name}\nB = {b_name}");
    for warning in &comparison.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
    let _ = writeln!(
        out,
        "{:<26} {:>12} {:>12} {:>12} {:>9}",
        "metric", "A", "B", "B-A", "B-A %"
    );
    for r in rows {
        let pct = r
            .delta_pct
            .map_or_else(|| "-".to_owned(), |p| format!("{p:+.1}%"));
        let delta = r
            .delta
            .map_or_else(|| "-".to_owned(), |d| format!("{d:+.2}"));
        let _ = writeln!(
            out,
            "{:<26} {:>12} {:>12} {:>12} {:>9}",
            r.metric,
            cell(r.a),
            cell(r.b),
            delta,
            pct
        );
    }
    for note in &comparison.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

//! Server-side truth from `GET /metrics`: genslot's own counters before and after a run.
//!
//! Only `genslot_`-prefixed counters (`…_total`) are kept; the run's value of each is the
//! difference of two scrapes. Servers without genslot metrics (or without `/metrics`) simply
//! give no server block in the summary.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Counter values by full series name, e.g. `genslot_resumes_total{forced="true"}`.
pub type Counters = BTreeMap<String, f64>;

/// Parses Prometheus text exposition, keeping `genslot_*_total` series.
/// Unparsable lines are skipped: a scrape is informative, never fatal.
pub fn parse_counters(text: &str) -> Counters {
    let mut out = Counters::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || !line.starts_with("genslot_") {
            continue;
        }
        // The value follows the series (name plus optional `{labels}`, which may hold spaces
        // inside quoted values); an optional timestamp may follow the value.
        let series_end = match line.find('{') {
            Some(open) => match line[open..].find('}') {
                Some(close) => open + close + 1,
                None => continue,
            },
            None => line.find(char::is_whitespace).unwrap_or(line.len()),
        };
        let (series, rest) = line.split_at(series_end);
        let name = series.split('{').next().unwrap_or(series);
        if !name.ends_with("_total") {
            continue;
        }
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            out.insert(normalise_series(series), v);
        }
    }
    out
}

/// Sorts labels so `{a="1",b="2"}` and `{b="2",a="1"}` name the same series.
fn normalise_series(series: &str) -> String {
    let Some((name, labels)) = series.split_once('{') else {
        return series.to_owned();
    };
    let labels = labels.trim_end_matches('}');
    let mut parts: Vec<&str> = labels
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    parts.sort_unstable();
    format!("{name}{{{}}}", parts.join(","))
}

/// What the server's counters say about one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerDelta {
    pub pauses: f64,
    pub resumes_normal: f64,
    pub resumes_forced: f64,
    /// Every genslot counter's increase over the run.
    pub counters: Counters,
}

impl ServerDelta {
    pub fn between(before: &Counters, after: &Counters) -> Self {
        let counters: Counters = after
            .iter()
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
            .collect();
        let sum = |pred: &dyn Fn(&str) -> bool| -> f64 {
            counters
                .iter()
                .filter(|(k, _)| pred(k))
                .map(|(_, v)| v)
                .sum()
        };
        Self {
            pauses: sum(&|k| k.split('{').next() == Some("genslot_pauses_total")),
            resumes_normal: sum(&|k| {
                k.starts_with("genslot_resumes_total") && !k.contains("forced=\"true\"")
            }),
            resumes_forced: sum(&|k| {
                k.starts_with("genslot_resumes_total") && k.contains("forced=\"true\"")
            }),
            counters,
        }
    }
}

/// One scrape; `None` when the endpoint is missing, failing, or has no genslot counters.
pub async fn scrape(http: &reqwest::Client, url: &str) -> Option<Counters> {
    let resp = http
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let text = resp.text().await.ok()?;
    let has_genslot = text.lines().any(|l| l.starts_with("genslot_"));
    has_genslot.then(|| parse_counters(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str =
        "# HELP genslot_pauses_total Pauses\n# TYPE genslot_pauses_total counter\n\
        genslot_pauses_total 3\n\
        genslot_resumes_total{forced=\"false\"} 2\n\
        genslot_resumes_total{forced=\"true\"} 1\n\
        genslot_num_requests_running 7\n\
        vllm_other_total 99\n";
    const AFTER: &str = "genslot_pauses_total 10 1700000000000\n\
        genslot_resumes_total{forced=\"false\"} 6\n\
        genslot_resumes_total{forced=\"true\"} 4\n\
        genslot_requests_rejected_total{reason=\"queue full\"} 5\n";

    #[test]
    fn run_deltas_count_pauses_and_normal_and_forced_resumes() {
        let d = ServerDelta::between(&parse_counters(BEFORE), &parse_counters(AFTER));
        assert_eq!(d.pauses, 7.0);
        assert_eq!(d.resumes_normal, 4.0);
        assert_eq!(d.resumes_forced, 3.0);
        assert_eq!(
            d.counters
                .get("genslot_requests_rejected_total{reason=\"queue full\"}"),
            Some(&5.0)
        );
    }

    #[test]
    fn gauges_and_foreign_metrics_are_not_counted() {
        let c = parse_counters(BEFORE);
        assert!(!c
            .keys()
            .any(|k| k.contains("running") || k.starts_with("vllm")));
        assert_eq!(c.len(), 3);
    }
}

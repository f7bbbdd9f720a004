//! The binary's two commands, from parsed arguments to files and a printed table.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};

use crate::cli::{CompareArgs, RunArgs};
use crate::client::{connect_failure, Endpoint, EndpointKind};
use crate::compare::{compare_files, render};
use crate::poisson::PoissonArrivals;
use crate::record::{ErrorKind, RequestRecord};
use crate::runner::{run_until, RunConfig};
use crate::source::Source;
use crate::summary::{RunInfo, StopReason, Summary};

/// Builds the request source named on the command line; returns it with a description.
pub fn build_source(args: &RunArgs) -> anyhow::Result<(Box<dyn Source>, String)> {
    let s = &args.source;
    const MAX_LANES: usize = genslot::workload::MAX_LANES as usize;
    if let Some(c) = args.concurrency.filter(|&c| c > MAX_LANES) {
        bail!("--concurrency must be at most {MAX_LANES}, got {c}");
    }
    if s.synthetic && !(1..=MAX_LANES).contains(&args.synthetic_sessions) {
        bail!(
            "--synthetic-sessions must be 1 to {MAX_LANES}, got {}",
            args.synthetic_sessions
        );
    }
    if let Some(rate) = args.request_rate {
        if s.weka.is_some() || s.mooncake.is_some() || s.azure.is_some() {
            bail!(
                "--request-rate applies to --fixed and --synthetic only: --weka replays \
                 closed-loop lanes, and --mooncake/--azure follow their timestamps \
                 (speed them up with --rate-scale)"
            );
        }
        if args.rate_scale != 1.0 {
            bail!("--rate-scale scales trace timestamps; with --request-rate give the rate itself");
        }
        PoissonArrivals::new(rate, args.seed)?;
        if args.concurrency == Some(0) {
            bail!(
                "--concurrency with --request-rate caps requests in flight and must be at least 1"
            );
        }
        return crate::replay::build(args);
    }
    let closed_loop = s.weka.is_some() || s.synthetic || s.fixed.is_some();
    if closed_loop && args.concurrency.is_none_or(|c| c == 0) {
        bail!("--concurrency (at least 1) is required for closed-loop lanes (--weka, --synthetic, --fixed)");
    }
    if !closed_loop && args.concurrency.is_some() {
        eprintln!(
            "note: --concurrency is ignored in open loop; arrivals follow the trace's timestamps"
        );
    }
    if !(args.rate_scale.is_finite() && args.rate_scale > 0.0) {
        bail!(
            "--rate-scale must be a positive number, got {}",
            args.rate_scale
        );
    }
    crate::replay::build(args)
}

/// `loadgen run`: drives the server, writes the requested files, prints the table. When
/// `interrupt` resolves the run ends early (see [`crate::runner::run_until`]) and what ran is
/// written and printed all the same; its summary's stop reason says so.
pub async fn run_command(
    args: &RunArgs,
    interrupt: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Summary> {
    if args.token_ids && args.endpoint == EndpointKind::Chat {
        bail!("--token-ids needs --endpoint completions (chat messages are text)");
    }
    // A run that could measure nothing is refused before the server is contacted.
    if args.duration.is_zero() {
        bail!("--duration must be above 0 (e.g. 120s)");
    }
    if args.request_timeout.is_zero() {
        bail!("--request-timeout must be above 0: every request would time out");
    }
    if args.max_requests == Some(0) {
        bail!("--max-requests must be at least 1");
    }
    let (mut source, description) = build_source(args)?;
    let model = match &args.model {
        Some(m) => {
            check_reachable(&args.url).await?;
            m.clone()
        }
        None => served_model(&args.url).await?,
    };
    let cfg = RunConfig {
        endpoint: Endpoint {
            base_url: args.url.clone(),
            kind: args.endpoint,
            model: model.clone(),
            token_ids: args.token_ids,
            request_timeout: args.request_timeout,
        },
        duration: args.duration,
        max_requests: args.max_requests,
        grace: args.grace,
        progress: !args.no_progress,
        scrape_metrics: !args.no_scrape,
        send_arrival_time: args.send_arrival_time,
        send_jitter: args.send_jitter,
        jitter_seed: args.seed,
    };
    let out = run_until(source.as_mut(), &cfg, interrupt).await?;
    if out.abandoned > 0 {
        eprintln!(
            "warning: {} requests ignored cancellation and were aborted without a record",
            out.abandoned
        );
    }
    let info = RunInfo {
        url: args.url.clone(),
        endpoint: format!("{:?}", args.endpoint).to_lowercase(),
        model,
        source: description,
        // Lanes in a closed loop, the in-flight cap with a request rate; nothing otherwise.
        concurrency: args
            .concurrency
            .filter(|_| !source.open_loop() || args.request_rate.is_some()),
        rate_scale: args.rate_scale,
        seed: args.seed,
        duration_limit_s: args.duration.as_secs_f64(),
        max_requests: args.max_requests,
        send_jitter_ms: if source.open_loop() {
            0.0
        } else {
            args.send_jitter.as_secs_f64() * 1e3
        },
        request_rate: args.request_rate,
    };
    let mut summary = Summary::from_records(
        &out.records,
        out.stop_reason,
        out.wall_time_s,
        out.server_metrics,
        info,
    );
    summary.arrivals_skipped = out.skipped_arrivals;
    if let Some(path) = &args.records {
        write_records(path, &out.records, out.epoch_ns)?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing summary {}", path.display()))?;
    }
    print!("{}", summary.render_table());
    if summary.request_count.avg == 0.0 && summary.stop_reason != StopReason::Interrupted {
        bail!("{}", nothing_completed(&summary, &out.records, &args.url));
    }
    Ok(summary)
}

/// Why a run completed no measured request, for its error message: every request failed to
/// connect (the server is not there), every one failed otherwise, or some were still in flight
/// when the run ended (then more time may help).
pub fn nothing_completed(summary: &Summary, records: &[RequestRecord], url: &str) -> String {
    let measured = records.iter().filter(|r| !r.warmup);
    let sent = measured.clone().count();
    let connect_failures: Vec<&str> = measured
        .filter_map(|r| r.error.as_ref())
        .filter(|e| e.kind == ErrorKind::Connect)
        .map(|e| e.message.as_str())
        .collect();
    if sent > 0 && connect_failures.len() == sent {
        return format!(
            "cannot reach the server at {url}: {}; none of the {sent} measured requests \
             could connect",
            connect_failures[0]
        );
    }
    let (failed, cancelled) = (
        summary.error_request_count.avg,
        summary.cancelled_request_count.avg,
    );
    if cancelled == 0.0 && failed > 0.0 {
        let kinds: Vec<String> = summary
            .errors_by_kind
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        return format!(
            "no measured request completed: all {sent} failed ({}); the summary measures nothing",
            kinds.join(", ")
        );
    }
    // A lane's first turn is a warm-up the summary leaves out: long turns can fill the run.
    let warmups = records.iter().filter(|r| r.warmup).count();
    let after = if warmups > 0 {
        format!(" after {warmups} warm-up requests")
    } else {
        String::new()
    };
    format!(
        "no measured request completed ({sent} sent{after}: {failed} failed, {cancelled} still \
         in flight at the end were cancelled); the summary measures nothing. A longer \
         --duration or --grace, or shorter requests, may let some finish"
    )
}

/// `GET {base_url}/v1/models`, given 10 s.
async fn get_models(base_url: &str) -> Result<reqwest::Response, reqwest::Error> {
    reqwest::Client::new()
        .get(format!("{base_url}/v1/models"))
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
}

fn unreachable(base_url: &str, e: &reqwest::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot reach the server at {base_url}: {}",
        connect_failure(e)
    )
}

/// Fails fast, before anything is sent, when no connection can be made to `base_url` (the
/// server is down or the URL is wrong). Any answer, an error status included, will do: the
/// run itself shows what the server makes of its requests.
pub async fn check_reachable(base_url: &str) -> anyhow::Result<()> {
    match get_models(base_url).await {
        Err(e) if e.is_connect() => Err(unreachable(base_url, &e)),
        _ => Ok(()),
    }
}

/// The first model id of the server's `GET /v1/models` (OpenAI's list shape); `base_url` is
/// the server's root, as [`crate::cli::parse_base_url`] gives it.
pub async fn served_model(base_url: &str) -> anyhow::Result<String> {
    let url = format!("{base_url}/v1/models");
    let fail =
        |why: String| anyhow::anyhow!("cannot tell the model from {url}: {why}; pass --model");
    let response = get_models(base_url).await.map_err(|e| {
        if e.is_connect() {
            // --model would not help: nothing answers there.
            unreachable(base_url, &e)
        } else if e.is_timeout() {
            fail("no answer within 10 s".into())
        } else {
            fail(e.to_string())
        }
    })?;
    if !response.status().is_success() {
        return Err(fail(format!("HTTP {}", response.status())));
    }
    let list: serde_json::Value = response.json().await.map_err(|e| fail(e.to_string()))?;
    list["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| fail("the list names no model".into()))
}

/// Writes one AIPerf-shaped JSON object per request.
pub fn write_records(path: &Path, records: &[RequestRecord], epoch_ns: u128) -> anyhow::Result<()> {
    let ctx = || format!("writing records {}", path.display());
    let mut w = BufWriter::new(File::create(path).with_context(ctx)?);
    for r in records {
        serde_json::to_writer(&mut w, &r.to_export_json(epoch_ns)).with_context(ctx)?;
        w.write_all(b"\n").with_context(ctx)?;
    }
    w.flush().with_context(ctx)
}

/// `loadgen compare`: prints the delta table (and writes it as JSON when asked: the two
/// files, the rows, and the warnings and notes the table prints around them).
pub fn compare_command(args: &CompareArgs) -> anyhow::Result<()> {
    let comparison = compare_files(&args.a, &args.b)?;
    print!(
        "{}",
        render(
            &comparison,
            &args.a.display().to_string(),
            &args.b.display().to_string()
        )
    );
    if let Some(path) = &args.json {
        let mut doc = serde_json::to_value(&comparison)?;
        doc["a"] = args.a.display().to_string().into();
        doc["b"] = args.b.display().to_string().into();
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing comparison {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RequestError;
    use crate::summary::tests::{info, rec};

    #[test]
    fn when_nothing_completed_the_warmups_that_took_the_run_are_counted() {
        let cancelled = |id| RequestRecord {
            error: Some(RequestError {
                kind: ErrorKind::Cancelled,
                status: None,
                message: String::new(),
                retry_after_s: None,
            }),
            ..rec(id, false, 50.0, 60.0, 100.0, 10)
        };
        let records = [
            rec(0, true, 0.0, 50.0, 100.0, 10),
            rec(1, true, 0.0, 50.0, 100.0, 10),
            cancelled(2),
        ];
        let summary = Summary::from_records(&records, StopReason::Duration, 60.0, None, info());
        let why = nothing_completed(&summary, &records, "http://x");
        assert!(
            why.contains("(1 sent after 2 warm-up requests: 0 failed, 1 still"),
            "{why}"
        );
    }
}

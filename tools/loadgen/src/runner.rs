//! The run loop: sends what the [`Source`] says is due, feeds completions back, and stops by
//! itself.
//!
//! Stopping: no new request is sent after `duration` or once `max_requests` measured requests
//! have gone out (warm-up turns do not count). Requests still in flight may finish until
//! `duration + grace`; then they are cancelled and recorded as `cancelled`. An open-loop
//! source that runs out of rows ends the run when its last request completes.
//!
//! An interrupt (see [`run_until`]) stops the sends and cancels what is in flight at once:
//! the records and summary cover the part that ran.
//!
//! A closed-loop lane whose request failed to connect, or was refused with a 429 or 503, backs
//! off before its next send ([`crate::backoff`]), so a server that is down or restarting is not
//! hammered; open-loop arrivals keep their timestamps.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;
use crate::client::{execute, Endpoint};
use crate::jitter::SendJitter;
use crate::record::{Outcome, RequestRecord};
use crate::scrape::{scrape, ServerDelta};
use crate::source::Source;
use crate::summary::StopReason;

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub endpoint: Endpoint,
    pub duration: Duration,
    pub max_requests: Option<u64>,
    /// How long in-flight requests may run past `duration`.
    pub grace: Duration,
    pub progress: bool,
    /// Scrape `GET /metrics` before and after for genslot counters.
    pub scrape_metrics: bool,
    /// Send each request's scheduled time as its `x-arrival-time` (unix seconds).
    pub send_arrival_time: bool,
    /// Closed loop: each lane waits a seeded delay uniform in `[0, send_jitter)` after a
    /// completion before its next send, so lanes do not phase-lock to the server's decode
    /// loop (see [`crate::jitter`]). Zero sends back to back.
    pub send_jitter: Duration,
    /// Seeds the send jitter and the lanes' back-off ([`crate::backoff`]).
    pub jitter_seed: u64,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// In completion order.
    pub records: Vec<RequestRecord>,
    pub stop_reason: StopReason,
    pub wall_time_s: f64,
    /// Unix time of the run's start in nanoseconds (anchors the JSONL timestamps).
    pub epoch_ns: u128,
    pub server_metrics: Option<ServerDelta>,
    /// Requests that did not even report their cancellation (aborted; no record).
    pub abandoned: usize,
    /// Arrivals the source dropped instead of sending (a capped open loop).
    pub skipped_arrivals: u64,
}

/// How long the loop sleeps at most, so the progress bar and the stop checks stay live.
const TICK: Duration = Duration::from_millis(250);
/// After cancelling, how long to wait for tasks to report before giving up on them.
const CANCEL_DRAIN: Duration = Duration::from_secs(5);

/// The message takes the terminal's remaining width and is cut there rather than wrapped.
fn progress_bar(cfg: &RunConfig) -> ProgressBar {
    if !cfg.progress {
        return ProgressBar::hidden();
    }
    let (len, template) = match cfg.max_requests {
        Some(n) => (
            n,
            "{elapsed_precise} [{bar:30}] {pos}/{len} requests {wide_msg}",
        ),
        None => (
            cfg.duration.as_secs().max(1),
            "{elapsed_precise} [{bar:30}] {pos}/{len} s {wide_msg}",
        ),
    };
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The progress bar's counts: measured requests by [`Outcome`], as the summary counts them,
/// and warm-ups apart (whatever became of them), as the summary leaves them out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct BarCounts {
    completed: u64,
    failed: u64,
    cancelled: u64,
    warmups: u64,
}

/// Where the run is, for the progress bar's message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Sending,
    /// No more sends; in-flight requests may finish for `left` more.
    Grace {
        left: Duration,
    },
    /// The grace period is over; in-flight requests are being cancelled.
    Cancelling,
}

impl BarCounts {
    fn add(&mut self, rec: &RequestRecord) {
        let n = match (rec.warmup, rec.outcome()) {
            (true, _) => &mut self.warmups,
            (false, Outcome::Completed) => &mut self.completed,
            (false, Outcome::Failed) => &mut self.failed,
            (false, Outcome::Cancelled) => &mut self.cancelled,
        };
        *n += 1;
    }

    fn message(&self, phase: Phase, in_flight: usize) -> String {
        let counts = format!(
            "completed {}, failed {}, cancelled {}, warm-ups {}",
            self.completed, self.failed, self.cancelled, self.warmups
        );
        match phase {
            // The counts first: a narrow terminal cuts the message's end.
            Phase::Sending => format!("{counts}, in flight {in_flight}"),
            Phase::Grace { left } => format!(
                "grace: waiting up to {} s for {in_flight} in-flight requests; {counts}",
                left.as_secs_f64().ceil() as u64
            ),
            Phase::Cancelling => format!("cancelling {in_flight} in-flight requests; {counts}"),
        }
    }
}

/// Runs `source` against `cfg.endpoint` until a stop condition holds.
pub async fn run(source: &mut dyn Source, cfg: &RunConfig) -> anyhow::Result<RunOutput> {
    run_until(source, cfg, std::future::pending()).await
}

/// [`run`], or until `interrupt` resolves: then no request is sent after it and the ones in
/// flight are cancelled without waiting for the grace period. Before `duration` the run's
/// stop reason becomes [`StopReason::Interrupted`]; in the grace period it keeps its own.
pub async fn run_until(
    source: &mut dyn Source,
    cfg: &RunConfig,
    interrupt: impl std::future::Future<Output = ()>,
) -> anyhow::Result<RunOutput> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .build()?;
    let endpoint = Arc::new(cfg.endpoint.clone());
    let metrics_url = endpoint.metrics_url();
    let before = if cfg.scrape_metrics {
        scrape(&http, &metrics_url).await
    } else {
        None
    };

    let bar = progress_bar(cfg);
    let epoch_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let t0 = Instant::now();
    let secs = |t: Instant| t.duration_since(t0).as_secs_f64();
    let stop_issuing_at = t0 + cfg.duration;
    let mut cancel_at = stop_issuing_at + cfg.grace;
    let mut interrupt = std::pin::pin!(interrupt);
    let mut interrupted = false;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<RequestRecord>();
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();

    let mut records = Vec::new();
    let mut outstanding = 0usize;
    let mut measured_sent = 0u64;
    let mut counts = BarCounts::default();
    let mut stop: Option<StopReason> = None;
    let mut cancelled_at: Option<Instant> = None;
    let mut abandoned = 0usize;
    let mut jitter = SendJitter::new(cfg.send_jitter, cfg.jitter_seed);
    let mut backoff = Backoff::new(cfg.jitter_seed);
    let closed_loop = !source.open_loop();

    source.start(0.0);
    loop {
        let now = Instant::now();
        if stop.is_none() && now >= stop_issuing_at {
            stop = Some(StopReason::Duration);
        }
        if stop.is_none() {
            for job in source.pop_due(secs(now)) {
                if cfg.max_requests.is_some_and(|max| measured_sent >= max) {
                    stop = Some(StopReason::MaxRequests);
                    break;
                }
                measured_sent += u64::from(!job.warmup);
                outstanding += 1;
                let (http, ep, tx, cancel) = (
                    http.clone(),
                    endpoint.clone(),
                    done_tx.clone(),
                    cancel_rx.clone(),
                );
                let arrival = cfg
                    .send_arrival_time
                    .then(|| epoch_ns as f64 / 1e9 + job.send_at);
                tasks.spawn(async move {
                    let rec = execute(&http, &ep, &job, t0, arrival, cancel).await;
                    let _ = tx.send(rec);
                });
            }
            if cfg.max_requests.is_some_and(|max| measured_sent >= max) {
                stop = Some(StopReason::MaxRequests);
            } else if outstanding == 0 && source.next_due().is_none() {
                stop = Some(StopReason::SourceExhausted);
            }
        }
        if stop.is_some() && outstanding == 0 {
            break;
        }
        if cancelled_at.is_none() && now >= cancel_at {
            let _ = cancel_tx.send(true);
            cancelled_at = Some(now);
        }
        if cancelled_at.is_some_and(|c| now >= c + CANCEL_DRAIN) {
            // Every await in a request is cancellable, so this is a last resort.
            tasks.abort_all();
            abandoned = outstanding;
            break;
        }

        let mut wake = now + TICK;
        if stop.is_none() {
            if let Some(due) = source.next_due() {
                wake = wake.min(t0 + Duration::from_secs_f64(due.max(0.0)));
            }
            wake = wake.min(stop_issuing_at);
        } else if cancelled_at.is_none() {
            wake = wake.min(cancel_at);
        }
        tokio::select! {
            Some(rec) = done_rx.recv() => {
                let mut next = Some(rec);
                while let Some(rec) = next {
                    outstanding -= 1;
                    counts.add(&rec);
                    // The lane's gap runs from the response's end, not from when we noticed it;
                    // the jitter moves that end as a slower client would, and a failure that
                    // says "not now" (refused, 429, 503) adds the lane's back-off.
                    let ready_at = match rec.lane {
                        Some(lane) if closed_loop => {
                            rec.end_s + jitter.next(lane) + backoff.after(lane, rec.error.as_ref())
                        }
                        _ => rec.end_s,
                    };
                    source.on_complete(rec.id, ready_at);
                    if cfg.max_requests.is_some() && !rec.warmup {
                        bar.inc(1);
                    }
                    records.push(rec);
                    next = done_rx.try_recv().ok();
                }
            }
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
            _ = &mut interrupt, if !interrupted => {
                interrupted = true;
                stop.get_or_insert(StopReason::Interrupted);
                cancel_at = cancel_at.min(Instant::now());
            }
        }
        while tasks.try_join_next().is_some() {}
        if cfg.max_requests.is_none() {
            bar.set_position(t0.elapsed().as_secs().min(cfg.duration.as_secs()));
        }
        let phase = match (stop, cancelled_at) {
            (None, _) => Phase::Sending,
            (Some(_), None) => Phase::Grace {
                left: cancel_at.saturating_duration_since(Instant::now()),
            },
            (Some(_), Some(_)) => Phase::Cancelling,
        };
        bar.set_message(counts.message(phase, outstanding));
    }
    bar.finish_and_clear();
    let wall_time_s = t0.elapsed().as_secs_f64();
    let after = match before {
        Some(_) => scrape(&http, &metrics_url).await,
        None => None,
    };
    let server_metrics = before.zip(after).map(|(b, a)| ServerDelta::between(&b, &a));
    Ok(RunOutput {
        records,
        stop_reason: stop.unwrap_or(StopReason::Duration),
        wall_time_s,
        epoch_ns,
        server_metrics,
        abandoned,
        skipped_arrivals: source.skipped_arrivals(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ErrorKind, RequestError};
    use crate::summary::tests::info;
    use crate::summary::{self, Summary};

    fn rec(id: u64, warmup: bool, error: Option<ErrorKind>) -> RequestRecord {
        RequestRecord {
            error: error.map(|kind| RequestError {
                kind,
                status: (kind == ErrorKind::Http).then_some(503),
                message: String::new(),
                retry_after_s: None,
            }),
            ..summary::tests::rec(id, warmup, 1.0, 2.0, 100.0, 10)
        }
    }

    #[test]
    fn the_bar_counts_cancellations_apart_from_errors_as_the_summary_does() {
        let records = [
            rec(0, false, None),
            rec(1, false, None),
            rec(2, false, Some(ErrorKind::Http)),
            rec(3, false, Some(ErrorKind::Cancelled)),
            rec(4, false, Some(ErrorKind::Cancelled)),
            rec(5, true, Some(ErrorKind::Cancelled)),
            rec(6, true, None),
        ];
        let mut counts = BarCounts::default();
        records.iter().for_each(|r| counts.add(r));
        assert_eq!(
            counts,
            BarCounts {
                completed: 2,
                failed: 1,
                cancelled: 2,
                warmups: 2
            }
        );
        let s = Summary::from_records(&records, StopReason::Duration, 3.0, None, info());
        assert_eq!(
            [
                s.request_count.avg,
                s.error_request_count.avg,
                s.cancelled_request_count.avg,
                s.warmup_excluded as f64
            ],
            [
                counts.completed,
                counts.failed,
                counts.cancelled,
                counts.warmups
            ]
            .map(|n| n as f64),
            "the bar's counts are the summary's"
        );
        assert_eq!(
            counts.message(Phase::Sending, 3),
            "completed 2, failed 1, cancelled 2, warm-ups 2, in flight 3"
        );
    }

    #[test]
    fn the_grace_period_says_how_long_it_waits_and_for_how_many() {
        let counts = BarCounts::default();
        let grace = counts.message(
            Phase::Grace {
                left: Duration::from_millis(4_200),
            },
            50,
        );
        assert!(
            grace.starts_with("grace: waiting up to 5 s for 50 in-flight requests;"),
            "{grace}"
        );
        let cancelling = counts.message(Phase::Cancelling, 7);
        assert!(
            cancelling.starts_with("cancelling 7 in-flight requests;"),
            "{cancelling}"
        );
    }
}

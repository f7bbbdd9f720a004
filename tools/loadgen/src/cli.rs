//! Command-line arguments of `loadgen`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::client::EndpointKind;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Replays agentic traces against any OpenAI-compatible server",
    long_about = "Replays agentic traces against any OpenAI-compatible server: closed-loop \
        AgentX lanes on Weka traces (or synthetic sessions), open-loop timestamps on Mooncake \
        and Azure traces. `run` is the default subcommand."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Drive a server and report TTFT, ITL, E2E and throughput.
    Run(Box<RunArgs>),
    /// Compare two summary JSON files (B against A).
    Compare(CompareArgs),
}

/// Exactly one request source.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct SourceArgs {
    /// Weka-format agentic trace (JSON or JSONL, plain or gzip): closed-loop AgentX lanes.
    #[arg(long, value_name = "FILE")]
    pub weka: Option<PathBuf>,
    /// Mooncake FAST'25 JSONL trace: open loop by timestamp.
    #[arg(long, value_name = "FILE")]
    pub mooncake: Option<PathBuf>,
    /// Azure LLM inference CSV trace: open loop by timestamp.
    #[arg(long, value_name = "FILE")]
    pub azure: Option<PathBuf>,
    /// Synthetic agentic sessions fitted to the Weka traces: closed-loop AgentX lanes.
    #[arg(long)]
    pub synthetic: bool,
    /// Fixed-length closed loop, `ISL,OSL`: every request has ISL prompt and OSL output
    /// tokens, back to back on each lane (the load AIPerf's `--isl/--osl` sends).
    #[arg(long, value_name = "ISL,OSL", value_parser = parse_fixed)]
    pub fixed: Option<(u32, u32)>,
}

fn parse_fixed(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s.split_once(',').ok_or("expected ISL,OSL, e.g. 64,32")?;
    let n = |x: &str| {
        x.trim()
            .parse::<u32>()
            .map_err(|_| format!("`{x}` is not a token count"))
    };
    let (i, o) = (n(a)?, n(b)?);
    if i == 0 || o == 0 {
        return Err("ISL and OSL must be at least 1".into());
    }
    Ok((i, o))
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Server URL, e.g. http://127.0.0.1:8000, or its OpenAI base URL
    /// (http://127.0.0.1:8000/v1): both mean the same server. Plain HTTP (no TLS).
    #[arg(long, value_parser = parse_base_url)]
    pub url: String,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Closed-loop lanes (required for --weka, --synthetic and --fixed without
    /// --request-rate). With --request-rate: a cap on requests in flight; an arrival that
    /// finds the cap in flight is skipped, as in AIPerf.
    #[arg(long, short = 'c')]
    pub concurrency: Option<usize>,
    /// Open loop for --fixed and --synthetic: Poisson arrivals at this many requests per
    /// second (exponential inter-arrival times seeded by --seed), never waiting on responses.
    #[arg(long, value_name = "R")]
    pub request_rate: Option<f64>,
    /// Open loop: arrival-rate multiplier (2.0 sends the trace twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Stop sending after this long (e.g. 120s, 5m, 1h30m, 500ms).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop sending after this many measured (non-warm-up) requests.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// In-flight requests may run this long past --duration before they are cancelled.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// A request running longer than this counts as a timeout.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    #[arg(long, value_enum, default_value_t = EndpointKind::Completions)]
    pub endpoint: EndpointKind,
    /// Model name sent with every request; without it, the first model the server lists at
    /// `GET /v1/models`.
    #[arg(long)]
    pub model: Option<String>,
    /// Send prompts as token ids instead of text (completions endpoint).
    #[arg(long)]
    pub token_ids: bool,
    /// Seeds session draws, start points, synthetic sessions, prompts, Poisson arrivals, the
    /// send jitter and the lanes' back-off.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Closed loop: after each completion a lane waits an extra delay drawn uniformly from
    /// [0, this) (seeded by --seed) before its next send. Back-to-back lanes otherwise send
    /// just after a decode step ends and phase-lock to the server's step loop; 0 turns it off.
    #[arg(long, default_value = "40ms", value_parser = parse_duration)]
    pub send_jitter: Duration,
    /// Cap on a closed-loop lane's idle gap between turns.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub idle_cap: Duration,
    /// Range of each lane's random start point within its first session, as fractions
    /// `LO,HI` (AgentX MVP: 0,1; AIPerf's agentx preset: 0.25,0.75).
    #[arg(long, default_value = "0,1", value_parser = parse_fraction_range)]
    pub start_fraction: (f64, f64),
    /// Do not send the warm-up turn before each lane's start point.
    #[arg(long)]
    pub no_warmup: bool,
    /// Multiply every prompt length of a trace or of the synthetic sessions by F in (0, 1],
    /// thinning prefix blocks so prefix reuse keeps its shape (`genslot sim --context-scale`
    /// applies the same function).
    #[arg(long, value_name = "F")]
    pub context_scale: Option<f64>,
    /// Cut every prompt to its first N tokens (after --context-scale).
    #[arg(long, value_name = "N")]
    pub max_context: Option<u32>,
    /// Number of synthetic sessions to generate (--synthetic).
    #[arg(long, default_value_t = 512)]
    pub synthetic_sessions: usize,
    /// Write the summary JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write per-request records (JSONL) here.
    #[arg(long, value_name = "FILE")]
    pub records: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Send each request's scheduled send time as the `x-arrival-time` header (unix
    /// seconds), so a genslot server measures TTFT from there.
    #[arg(long)]
    pub send_arrival_time: bool,
    /// Do not scrape GET /metrics for genslot counters.
    #[arg(long)]
    pub no_scrape: bool,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Baseline summary (A).
    pub a: PathBuf,
    /// Summary compared against the baseline (B).
    pub b: PathBuf,
    /// Also write the comparison as JSON here: `a`, `b`, `rows` (metric, a, b, delta,
    /// delta_pct) and the `warnings` and `notes` printed around the table.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Parses `120s`, `5m`, `1h30m`, `250ms`, `1.5s`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("bad duration '{s}': {e}"));
    }
    let mut total = 0.0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let unit_len = rest[num_len..]
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len() - num_len);
        let (num, unit) = (&rest[..num_len], &rest[num_len..num_len + unit_len]);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("bad duration '{s}': expected a number"))?;
        let scale = match unit {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "bad duration '{s}': unit '{unit}' is not ms, s, m or h"
                ))
            }
        };
        total += value * scale;
        rest = &rest[num_len + unit_len..];
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("bad duration '{s}': {e}"))
}

/// Accepts an http URL with a host, e.g. `http://127.0.0.1:8000`, and returns it as the
/// server's root: an OpenAI base URL (`http://127.0.0.1:8000/v1`) and a trailing slash are
/// accepted, since every route loadgen calls (`/v1/models`, `/v1/completions`,
/// `/v1/chat/completions`, `/metrics`) is joined to the root. Says what is wrong with anything
/// else instead of letting the first request fail on it.
pub fn parse_base_url(s: &str) -> Result<String, String> {
    const EXPECTED: &str = "expected the server's base URL, e.g. http://127.0.0.1:8000";
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL ({e}); {EXPECTED}"))?;
    // Built without TLS (its crates would double the build for a tool that drives a GEN
    // worker on its own network): an https URL would fail at the first request instead.
    if url.scheme() == "https" {
        return Err(format!(
            "https is not supported: loadgen speaks plain HTTP (built without TLS); give the \
             server's http address; {EXPECTED}"
        ));
    }
    if url.scheme() != "http" {
        return Err(format!(
            "the scheme is `{}`, not http; {EXPECTED}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("no host; {EXPECTED}"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "a query or fragment cannot be joined to the routes; {EXPECTED}"
        ));
    }
    Ok(server_root(&url))
}

/// `url` without a trailing `/v1` and without trailing slashes: `http://h:8000/v1/` and
/// `http://h:8000/` both give `http://h:8000`; a path prefix (a proxy's) is kept.
fn server_root(url: &reqwest::Url) -> String {
    let path = url.path().trim_end_matches('/');
    let path = path
        .strip_suffix("/v1")
        .unwrap_or(path)
        .trim_end_matches('/');
    let mut root = url.clone();
    root.set_path(path);
    root.as_str().trim_end_matches('/').to_owned()
}

/// Parses `LO,HI` with `0 <= LO <= HI <= 1`.
pub fn parse_fraction_range(s: &str) -> Result<(f64, f64), String> {
    let bad = || format!("bad fraction range '{s}': expected LO,HI with 0 <= LO <= HI <= 1");
    let (lo, hi) = s.split_once(',').ok_or_else(bad)?;
    let lo: f64 = lo.trim().parse().map_err(|_| bad())?;
    let hi: f64 = hi.trim().parse().map_err(|_| bad())?;
    if (0.0..=1.0).contains(&lo) && (0.0..=1.0).contains(&hi) && lo <= hi {
        Ok((lo, hi))
    } else {
        Err(bad())
    }
}

/// Makes `run` the default subcommand: `loadgen --url … --synthetic` means `loadgen run …`.
pub fn with_default_subcommand(args: Vec<String>) -> Vec<String> {
    let first = args.get(1).map(String::as_str);
    let explicit = matches!(
        first,
        Some("run" | "compare" | "help" | "-h" | "--help" | "-V" | "--version") | None
    );
    if explicit {
        return args;
    }
    let mut out = args;
    out.insert(1, "run".to_owned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_units_compounds_and_bare_seconds() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-3").is_err());
    }

    #[test]
    fn a_base_url_is_normalised_to_the_server_root_with_or_without_v1() {
        for given in [
            "http://127.0.0.1:8000",
            "http://127.0.0.1:8000/",
            "http://127.0.0.1:8000/v1",
            "http://127.0.0.1:8000/v1/",
            "http://127.0.0.1:8000//v1//",
        ] {
            assert_eq!(
                parse_base_url(given).as_deref(),
                Ok("http://127.0.0.1:8000"),
                "{given}"
            );
        }
        // A proxy's path prefix stays; only a last `/v1` goes.
        assert_eq!(
            parse_base_url("http://gw.example.com/llm/v1/").as_deref(),
            Ok("http://gw.example.com/llm")
        );
        assert_eq!(
            parse_base_url("http://h:8000/v1x").as_deref(),
            Ok("http://h:8000/v1x")
        );
        assert!(parse_base_url("http://h:8000/v1?key=1")
            .unwrap_err()
            .contains("query"));
    }

    #[test]
    fn base_urls_must_be_http_with_a_host() {
        assert!(parse_base_url("http://127.0.0.1:8000").is_ok());
        // No TLS in this build: said at once, not at the first request.
        let err = parse_base_url("https://example.com/v1").unwrap_err();
        assert!(err.contains("https is not supported"), "{err}");
        let err = parse_base_url("notaurl").unwrap_err();
        assert!(err.contains("not a URL"), "{err}");
        assert!(err.contains("http://127.0.0.1:8000"), "{err}");
        assert!(parse_base_url("ftp://host").unwrap_err().contains("scheme"));
        assert!(parse_base_url("127.0.0.1:8000").is_err());
    }

    #[test]
    fn start_fraction_ranges_must_lie_in_the_unit_interval() {
        assert_eq!(parse_fraction_range("0.25, 0.75"), Ok((0.25, 0.75)));
        assert!(parse_fraction_range("0.8,0.2").is_err());
        assert!(parse_fraction_range("0,1.5").is_err());
        assert!(parse_fraction_range("0.5").is_err());
    }

    #[test]
    fn run_is_the_default_subcommand() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let args = with_default_subcommand(argv(&[
            "loadgen",
            "--url",
            "http://u",
            "--synthetic",
            "-c",
            "2",
        ]));
        let cli = Cli::try_parse_from(args).unwrap();
        assert!(
            matches!(cli.command, Command::Run(r) if r.source.synthetic && r.concurrency == Some(2))
        );
        let cli = Cli::try_parse_from(with_default_subcommand(argv(&[
            "loadgen", "compare", "a", "b",
        ])))
        .unwrap();
        assert!(matches!(cli.command, Command::Compare(_)));
    }

    #[test]
    fn exactly_one_source_is_required() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(Cli::try_parse_from(argv(&["loadgen", "run", "--url", "http://u"])).is_err());
        assert!(Cli::try_parse_from(argv(&[
            "loadgen",
            "run",
            "--url",
            "http://u",
            "--synthetic",
            "--weka",
            "f"
        ]))
        .is_err());
    }
}

//! Request sources built from `genslot::workload`: its trace loaders and its replay engines
//! (AgentX closed-loop lanes, open-loop timestamps), adapted to the runner's [`Source`], and
//! the Poisson arrivals of `--request-rate` over fixed-length or synthetic requests.

use std::sync::Arc;

use anyhow::Context;
use genslot::workload::{
    load_trace, AgentxReplay, ContextTransform, Issue, OpenLoopReplay, OpenLoopRules, Replay,
    ReplayRules, Session, SynthParams, SyntheticAgentic, Trace, TraceFormat,
};

use crate::cli::RunArgs;
use crate::poisson::{PoissonArrivals, PoissonSource, Shape, Shapes};
use crate::source::{Job, Source};

/// Any `genslot::workload` replay engine as a [`Source`].
pub struct ReplaySource<R> {
    engine: R,
    open_loop: bool,
    /// Mixed into every prompt so runs with different seeds never share a prefix cache.
    salt: u64,
}

impl<R: Replay> ReplaySource<R> {
    pub fn new(engine: R, open_loop: bool, salt: u64) -> Self {
        Self {
            engine,
            open_loop,
            salt,
        }
    }

    fn job(&self, i: Issue) -> Job {
        Job {
            id: i.id,
            lane: i.lane,
            session: Some(i.session),
            conversation: i.lane.map(|_| i.instance),
            input_tokens: i.input_tokens,
            max_tokens: i.max_tokens,
            hash_ids: i.hash_ids.to_vec(),
            block_size: i.block_size,
            prefix_salt: self.salt,
            warmup: i.warmup,
            send_at: i.send_at,
        }
    }
}

impl<R: Replay + Send> Source for ReplaySource<R> {
    fn start(&mut self, now: f64) {
        self.engine.start(now);
    }

    fn next_due(&self) -> Option<f64> {
        self.engine.next_due()
    }

    fn pop_due(&mut self, now: f64) -> Vec<Job> {
        let issues = self.engine.pop_due(now);
        issues.into_iter().map(|i| self.job(i)).collect()
    }

    fn on_complete(&mut self, id: u64, now: f64) {
        // The runner completes exactly the ids it popped, once, so the engine cannot reject
        // one; ignoring the impossible error keeps a run from dying on bookkeeping.
        let _ = self.engine.on_complete(id, now);
    }

    fn open_loop(&self) -> bool {
        self.open_loop
    }
}

/// The closed-loop rules from the command line (AgentX defaults otherwise).
fn rules(args: &RunArgs) -> ReplayRules {
    ReplayRules {
        concurrency: args.concurrency.unwrap_or(1),
        idle_cap_s: args.idle_cap.as_secs_f64(),
        start_fraction: args.start_fraction,
        warmup: !args.no_warmup,
    }
}

fn describe_rules(r: &ReplayRules) -> String {
    format!(
        "AgentX lanes (idle cap {} s, start fraction {}-{}, warm-up {})",
        r.idle_cap_s,
        r.start_fraction.0,
        r.start_fraction.1,
        if r.warmup { "on" } else { "off" }
    )
}

/// The context transform of `--context-scale` / `--max-context` (the identity without them).
pub fn context_transform(args: &RunArgs) -> anyhow::Result<ContextTransform> {
    let t = ContextTransform::new(args.context_scale, args.max_context)
        .map_err(|e| anyhow::anyhow!("--context-scale / --max-context: {e}"))?;
    if !t.is_identity() && args.source.fixed.is_some() {
        anyhow::bail!(
            "--context-scale and --max-context transform traces and synthetic sessions; \
             give --fixed the lengths you want"
        );
    }
    Ok(t)
}

/// Synthetic sessions of `args`, context transform applied.
fn synthetic_sessions(args: &RunArgs) -> anyhow::Result<Vec<Session>> {
    let mut trace = Trace::Sessions(
        SyntheticAgentic::new(SynthParams::default()).generate(args.synthetic_sessions, args.seed),
    );
    context_transform(args)?.apply(&mut trace);
    Ok(match trace {
        Trace::Sessions(s) => s,
        Trace::Requests { .. } => Vec::new(),
    })
}

/// `, contexts x0.03125, at most 16384 tokens` for a description, or nothing.
fn describe_transform(args: &RunArgs) -> String {
    match context_transform(args) {
        Ok(t) if !t.is_identity() => format!(", {}", t.describe()),
        _ => String::new(),
    }
}

/// Open-loop Poisson arrivals at `rate` carrying fixed-length or synthetic requests.
fn poisson(args: &RunArgs, rate: f64) -> anyhow::Result<(Box<dyn Source>, String)> {
    let s = &args.source;
    let (shapes, what) = if let Some((isl, osl)) = s.fixed {
        let shapes = Shapes::Fixed {
            input: isl,
            output: osl,
        };
        (shapes, format!("fixed {isl} prompt / {osl} output tokens"))
    } else if s.synthetic {
        let sessions = synthetic_sessions(args)?;
        let pool: Vec<Shape> = sessions
            .iter()
            .enumerate()
            .flat_map(|(i, session)| {
                session.all_requests().into_iter().map(move |(_, r)| Shape {
                    input_tokens: r.input_tokens,
                    output_tokens: r.output_tokens,
                    hash_ids: r.hash_ids.to_vec(),
                    block_size: session.block_size,
                    session: Some(i),
                })
            })
            .collect();
        let what = format!(
            "the {} requests of {} synthetic agentic sessions in order{}",
            pool.len(),
            args.synthetic_sessions,
            describe_transform(args)
        );
        (Shapes::Pool(pool), what)
    } else {
        anyhow::bail!("--request-rate needs --fixed or --synthetic");
    };
    let arrivals = PoissonArrivals::new(rate, args.seed)?;
    let source = PoissonSource::new(arrivals, shapes, args.concurrency, args.seed)
        .context("Poisson arrivals")?;
    let cap = match args.concurrency {
        Some(c) => format!(", at most {c} in flight"),
        None => String::new(),
    };
    Ok((
        Box::new(source),
        format!("{what}, open-loop Poisson arrivals at {rate} requests/s{cap}"),
    ))
}

/// Builds the source named on the command line, with a one-line description.
pub fn build(args: &RunArgs) -> anyhow::Result<(Box<dyn Source>, String)> {
    let s = &args.source;
    let salt = args.seed;
    context_transform(args)?; // refuses a transform of --fixed before any source is built
    if let Some(rate) = args.request_rate {
        return poisson(args, rate);
    }
    if let Some((isl, osl)) = s.fixed {
        let c = args.concurrency.unwrap_or(1);
        let desc = format!("fixed {isl} prompt / {osl} output tokens, {c} lanes back to back");
        return Ok((
            Box::new(crate::source::FixedLanes::new(c, isl, osl, 0.0, false)),
            desc,
        ));
    }
    if s.synthetic {
        let sessions = synthetic_sessions(args)?;
        let engine = AgentxReplay::new(Arc::from(sessions), rules(args), args.seed)
            .context("synthetic AgentX replay")?;
        let desc = format!(
            "{} synthetic agentic sessions{}, {}",
            args.synthetic_sessions,
            describe_transform(args),
            describe_rules(&rules(args))
        );
        return Ok((Box::new(ReplaySource::new(engine, false, salt)), desc));
    }
    let (path, format) = match (&s.weka, &s.mooncake, &s.azure) {
        (Some(p), _, _) => (p, TraceFormat::Weka),
        (_, Some(p), _) => (p, TraceFormat::Mooncake),
        (_, _, Some(p)) => (p, TraceFormat::Azure),
        _ => anyhow::bail!("no request source given (--weka, --mooncake, --azure or --synthetic)"),
    };
    let mut trace = load_trace(path, Some(format))?;
    context_transform(args)?.apply(&mut trace);
    let desc = format!(
        "{format:?} trace {}{}",
        path.display(),
        describe_transform(args)
    );
    match trace {
        Trace::Sessions(sessions) => {
            let engine = AgentxReplay::new(Arc::from(sessions), rules(args), args.seed)
                .with_context(|| format!("AgentX replay of {}", path.display()))?;
            let desc = format!("{desc}, {}", describe_rules(&rules(args)));
            Ok((Box::new(ReplaySource::new(engine, false, salt)), desc))
        }
        Trace::Requests { requests, .. } => {
            let open = OpenLoopRules {
                scale: args.rate_scale,
                max_requests: args.max_requests.and_then(|n| usize::try_from(n).ok()),
                max_duration_s: Some(args.duration.as_secs_f64()),
            };
            let engine = OpenLoopReplay::new(Arc::from(requests), open)
                .with_context(|| format!("open-loop replay of {}", path.display()))?;
            Ok((
                Box::new(ReplaySource::new(engine, true, salt)),
                format!("{desc}, open loop x{}", args.rate_scale),
            ))
        }
    }
}

//! The `genslot` binary: `serve`, `sim`, `fit-step`, `check-config`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "genslot",
    version,
    about = "GEN server that pauses decode requests in place to protect the TTFT tail"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config file and print the resolved config (every default filled in).
    CheckConfig {
        /// YAML file to check.
        file: PathBuf,
    },
    /// Serve the OpenAI-compatible API with the scheduler in front of a step backend.
    Serve(ServeArgs),
    /// Simulate arms (control vs preemption settings) over agentic traffic in virtual time.
    Sim(Box<genslot::sim::cli::SimArgs>),
    /// Fit the simulator's step-time (and transfer-time) model to measured grids.
    FitStep(genslot::sim::fit_cli::FitArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => {
            match genslot::config::check_config(&file, &genslot::config::Host::current()) {
                Ok(checked) => {
                    for w in &checked.warnings {
                        eprintln!("{w}");
                    }
                    print!("{}", checked.yaml);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Sim(args) => report(genslot::sim::cli::run(*args)),
        Command::FitStep(args) => report(genslot::sim::fit_cli::run(args)),
        Command::Serve(args) => report(serve(args)),
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    /// YAML config; without it the embedded default runs.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen address (overrides `server.host`).
    #[arg(long)]
    host: Option<String>,
    /// Listen port (overrides `server.port`; 0 picks a free one).
    #[arg(long)]
    port: Option<u16>,
    /// Step backend (overrides `backend`).
    #[arg(long, value_enum)]
    backend: Option<BackendArg>,
    /// Write one JSON line per request that leaves the scheduler to this file (arrival,
    /// context and output tokens, first-token and finish times, pauses, outcome), for
    /// `genslot sim --replay`.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Model,
    Cuda,
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use genslot::config::{Backend, Config, Host, DEFAULT_YAML, EMBEDDED_ORIGIN};
    use std::io::IsTerminal as _;

    // Colour only on a terminal: redirected logs stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    let (text, origin) = match &args.config {
        Some(path) => (genslot::config::read(path)?, path.display().to_string()),
        None => (DEFAULT_YAML.to_owned(), EMBEDDED_ORIGIN.to_owned()),
    };
    let mut cfg = Config::from_yaml_str(&text, &origin)?;
    let mut flags = Vec::new();
    if let Some(h) = args.host {
        cfg.server.host = h;
        flags.push(("server.host", "--host"));
    }
    if let Some(p) = args.port {
        cfg.server.port = p;
        flags.push(("server.port", "--port"));
    }
    if let Some(b) = args.backend {
        cfg.backend = match b {
            BackendArg::Model => Backend::Model,
            BackendArg::Cuda => Backend::Cuda,
        };
        flags.push(("backend", "--backend"));
    }
    for w in cfg.check_for_serving(&text, &origin, &Host::current(), &flags)? {
        tracing::warn!("{}", genslot::config::fmt_warning(&origin, &w));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(genslot::actors::serve::serve_recorded(
        cfg,
        args.record.as_deref(),
        genslot::signal::interrupt_or_terminate(),
    ))
}

fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

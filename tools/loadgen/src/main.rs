use std::process::ExitCode;

use clap::Parser;

use loadgen::cli::{with_default_subcommand, Cli, Command};

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(loadgen::app::run_command(&args))?;
        }
        Command::Compare(args) => loadgen::app::compare_command(&args)?,
    }
    Ok(())
}

/// The error and its causes on one line, without a backtrace (a bad file or argument is a
/// user's mistake, not a crash). Causes already quoted by their parent's message are skipped.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(with_default_subcommand(std::env::args().collect()));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

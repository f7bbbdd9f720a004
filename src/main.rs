//! The `genslot` binary: `serve`, `sim`, `check-config`.

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
    /// Simulate arms (control vs preemption settings) over agentic traffic in virtual time.
    Sim(Box<genslot::sim::cli::SimArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => match genslot::config::check_config(&file) {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Sim(args) => report(genslot::sim::cli::run(*args)),
    }
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

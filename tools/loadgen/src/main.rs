use clap::Parser;

use loadgen::cli::{with_default_subcommand, Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_from(with_default_subcommand(std::env::args().collect()));
    match cli.command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(loadgen::app::run_command(&args))?;
        }
        Command::Compare(args) => loadgen::app::compare_command(&args)?,
    }
    Ok(())
}

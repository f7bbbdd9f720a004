use std::process::ExitCode;

use clap::Parser;

use genslot::signal::interrupt_or_terminate;
use loadgen::cli::{with_default_subcommand, Cli, Command};
use loadgen::summary::StopReason;

/// The shell's exit status for a run ended by Ctrl-C or SIGTERM (128 + SIGINT, as shells
/// report an interrupted command).
const INTERRUPTED: u8 = 130;

/// `Ok(true)` when the run was interrupted (its results written all the same).
fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            let summary = runtime.block_on(async {
                let interrupt = first_interrupt();
                loadgen::app::run_command(&args, interrupt).await
            })?;
            Ok(summary.stop_reason == StopReason::Interrupted)
        }
        Command::Compare(args) => loadgen::app::compare_command(&args).map(|()| false),
    }
}

/// Resolves at the first interrupt, so the run can cancel what is in flight and write what
/// ran; a second one quits at once, writing nothing (a server that ignores cancellation
/// cannot hold the terminal).
async fn first_interrupt() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        interrupt_or_terminate().await;
        eprintln!(
            "\ninterrupted: cancelling the requests in flight and writing what ran \
             (interrupt again to quit at once)"
        );
        let _ = tx.send(());
        interrupt_or_terminate().await;
        eprintln!("interrupted again: quitting without writing the results");
        std::process::exit(i32::from(INTERRUPTED));
    });
    if rx.await.is_err() {
        std::future::pending::<()>().await;
    }
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
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => {
            eprintln!("interrupted: the summary and files cover the part of the run that ran");
            ExitCode::from(INTERRUPTED)
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

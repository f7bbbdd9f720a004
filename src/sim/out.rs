//! The sim and fit-step commands' tables on stdout. A reader that stops early (`| head`)
//! closes the pipe: the command then goes on quietly and still writes its files (`--json`,
//! `--svg`), where `print!` would panic and lose them. Any other write error is reported
//! once on stderr.

use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static FAILED: AtomicBool = AtomicBool::new(false);

pub fn write(text: std::fmt::Arguments) {
    if FAILED.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(text) {
        FAILED.store(true, Ordering::Relaxed);
        if e.kind() != ErrorKind::BrokenPipe {
            eprintln!("warning: stdout: {e}; the rest of the tables are not printed");
        }
    }
}

/// `print!` to stdout through [`write`].
macro_rules! say {
    ($($t:tt)*) => { $crate::sim::out::write(format_args!($($t)*)) };
}

/// `println!` to stdout through [`write`].
macro_rules! sayln {
    () => { $crate::sim::out::write(format_args!("\n")) };
    ($($t:tt)*) => {{
        $crate::sim::out::write(format_args!($($t)*));
        $crate::sim::out::write(format_args!("\n"));
    }};
}

pub(crate) use {say, sayln};

//! Errors of the workload module. Every file error names the file and, where there is one,
//! the line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not well-formed (bad JSON, bad CSV row, bad number).
    #[error("{path}:{line}: {msg}")]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    /// Well-formed, but a field is missing or out of range.
    #[error("{path}:{line}: {msg}")]
    Invalid {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error("{path}: cannot tell the trace format (expected Weka JSON/JSONL, Mooncake JSONL or Azure CSV)")]
    UnknownFormat { path: PathBuf },
    #[error("{path}: no requests in the trace")]
    Empty { path: PathBuf },
}

impl WorkloadError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Replay-engine misuse by the caller.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error("issue {0} is not in flight (never popped, or already completed)")]
    UnknownIssue(u64),
    #[error("replay has no sessions to draw from")]
    NoSessions,
    #[error("invalid replay rules: {0}")]
    Rules(String),
}

//! Errors of the workload module. Every file error names the file and, where there is one,
//! the line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    // The cause is in the message and not a source (thiserror makes a field named `source`
    // one), so a printed error chain names it once.
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The file starts as gzip but does not decompress.
    #[error("{path}: bad gzip stream: {cause}")]
    Gzip {
        path: PathBuf,
        cause: std::io::Error,
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
    /// No format's marks on the first non-blank line (`seen`, cut to 80 characters).
    #[error(
        "{path}:{line}: cannot tell the trace format from `{seen}`: tried Weka JSON/JSONL \
         (objects with \"requests\"), Mooncake JSONL (objects with \"timestamp\", \
         \"input_length\", \"output_length\") and Azure CSV (a header with TIMESTAMP, \
         ContextTokens, GeneratedTokens)"
    )]
    UnknownFormat {
        path: PathBuf,
        line: usize,
        seen: String,
    },
    /// A directory is read as Weka files; the other formats are one file each.
    #[error("{path}: a directory is read as Weka trace files; a {format:?} trace is one file")]
    Directory {
        path: PathBuf,
        format: super::format::TraceFormat,
    },
    #[error("{path}: no requests in the trace")]
    Empty { path: PathBuf },
}

impl WorkloadError {
    pub(crate) fn io(path: &std::path::Path, cause: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            cause,
        }
    }
}

/// serde_json's message without the position it appends ("at line L column C", counted in
/// the text it was given: one JSONL line for the line-by-line readers), and the column
/// after it (none at the end of the text). The caller names the file's line.
pub(crate) fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.line() == 0 {
        return text;
    }
    let position = format!(" at line {} column {}", e.line(), e.column());
    let what = text.strip_suffix(&position).unwrap_or(&text);
    match e.column() {
        // Past a line's end (the text ended): no column to point at.
        0 => what.to_string(),
        c => format!("{what} (column {c})"),
    }
}

/// Replay-engine misuse by the caller.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error("issue {0} is not in flight (never popped, or already completed)")]
    UnknownIssue(u64),
    #[error("no session of the workload has a request: nothing to replay")]
    NoSessions,
    #[error("invalid replay rules: {0}")]
    Rules(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_error_keeps_its_column_and_drops_serde_jsons_line_count() {
        let e = serde_json::from_str::<u64>("\"abc\"").unwrap_err();
        assert_eq!(
            json_message(&e),
            "invalid type: string \"abc\", expected u64 (column 5)"
        );
        let e = serde_json::from_str::<u64>("{\n\n  x").unwrap_err();
        assert!(!json_message(&e).contains("line"), "{}", json_message(&e));
    }
}

//! `load_trace`: one entry point for every supported trace format, with detection.

use std::path::Path;

use super::azure::{load_azure, parse_azure_str};
use super::error::WorkloadError;
use super::mooncake::{load_mooncake, parse_mooncake_str};
use super::source::read_text;
use super::types::{Session, TimedRequest};
use super::weka::{load_weka, parse_weka_str};

/// A trace file format; it serialises by the name `--trace-format` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// Weka sessions (JSON or JSONL, plain or gzip, or a directory of them): closed loop.
    Weka,
    /// Mooncake FAST'25 JSONL: open loop.
    Mooncake,
    /// Azure LLM inference CSV: open loop.
    Azure,
}

impl std::str::FromStr for TraceFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "weka" | "agentx" => Ok(Self::Weka),
            "mooncake" => Ok(Self::Mooncake),
            "azure" => Ok(Self::Azure),
            other => Err(format!(
                "unknown trace format `{other}` (weka, mooncake, azure)"
            )),
        }
    }
}

/// A loaded trace.
#[derive(Debug, Clone)]
pub enum Trace {
    Sessions(Vec<Session>),
    Requests {
        format: TraceFormat,
        requests: Vec<TimedRequest>,
    },
}

impl Trace {
    pub fn format(&self) -> TraceFormat {
        match self {
            Trace::Sessions(_) => TraceFormat::Weka,
            Trace::Requests { format, .. } => *format,
        }
    }
}

/// Loads `path` in `format`, or detects the format from the content when `None` (a
/// directory is Weka; a file by [`detect`]'s rules). A file without a non-blank line has no
/// requests; one that no rule matches is named with its first non-blank line.
pub fn load_trace(path: &Path, format: Option<TraceFormat>) -> Result<Trace, WorkloadError> {
    if path.is_dir() {
        return match format {
            None | Some(TraceFormat::Weka) => Ok(Trace::Sessions(load_weka(path)?)),
            Some(format) => Err(WorkloadError::Directory {
                path: path.to_path_buf(),
                format,
            }),
        };
    }
    match format {
        Some(TraceFormat::Weka) => Ok(Trace::Sessions(load_weka(path)?)),
        Some(f @ TraceFormat::Mooncake) => Ok(Trace::Requests {
            format: f,
            requests: load_mooncake(path)?,
        }),
        Some(f @ TraceFormat::Azure) => Ok(Trace::Requests {
            format: f,
            requests: load_azure(path)?,
        }),
        None => {
            let text = read_text(path)?;
            match sniff(&text, path)? {
                TraceFormat::Weka => Ok(Trace::Sessions(parse_weka_str(&text, path)?)),
                f @ TraceFormat::Mooncake => Ok(Trace::Requests {
                    format: f,
                    requests: parse_mooncake_str(&text, path)?,
                }),
                f @ TraceFormat::Azure => Ok(Trace::Requests {
                    format: f,
                    requests: parse_azure_str(&text, path)?,
                }),
            }
        }
    }
}

/// The format [`detect`] finds, or why there is none: a text without a non-blank line has no
/// requests; any other names its first non-blank line and what it holds.
fn sniff(text: &str, path: &Path) -> Result<TraceFormat, WorkloadError> {
    if let Some(format) = detect(text) {
        return Ok(format);
    }
    let Some((i, first)) = text.lines().enumerate().find(|(_, l)| !l.trim().is_empty()) else {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    };
    Err(WorkloadError::UnknownFormat {
        path: path.to_path_buf(),
        line: i + 1,
        seen: excerpt(first.trim(), 80),
    })
}

/// The first `max` characters of `s`, with `…` when cut.
fn excerpt(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_string(),
    }
}

/// Guesses the format from the text's start: a JSON object whose first line has
/// `timestamp` and `input_length` is Mooncake; one with `requests` (within the first 64 KiB)
/// is Weka; another whose first line has any Mooncake field is Mooncake (whose reader then
/// names the one missing). A first line naming any Azure column (`TIMESTAMP`,
/// `ContextTokens`, `GeneratedTokens`) is an Azure header (whose reader names a missing one).
pub fn detect(text: &str) -> Option<TraceFormat> {
    let body = text.trim_start();
    if body.starts_with('{') {
        let mut end = body.len().min(1 << 16);
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        let head = &body[..end];
        let first_line = head.lines().next().unwrap_or("");
        if first_line.contains("\"input_length\"") && first_line.contains("\"timestamp\"") {
            return Some(TraceFormat::Mooncake);
        }
        if head.contains("\"requests\"") {
            return Some(TraceFormat::Weka);
        }
        if ["\"timestamp\"", "\"input_length\"", "\"output_length\""]
            .iter()
            .any(|field| first_line.contains(field))
        {
            return Some(TraceFormat::Mooncake);
        }
        return None;
    }
    let header = body.lines().next().unwrap_or("").to_ascii_lowercase();
    if ["timestamp", "contexttokens", "generatedtokens"]
        .iter()
        .any(|column| header.contains(column))
    {
        return Some(TraceFormat::Azure);
    }
    None
}

//! `load_trace`: one entry point for every supported trace format, with detection.

use std::path::Path;

use super::azure::{load_azure, parse_azure_str};
use super::error::WorkloadError;
use super::mooncake::{load_mooncake, parse_mooncake_str};
use super::source::read_text;
use super::types::{Session, TimedRequest};
use super::weka::{load_weka, parse_weka_str};

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Loads `path` in `format`, or detects the format from the content when `None`
/// (a directory is Weka; a JSON object with `input_length` is Mooncake, with `requests`
/// Weka; a first line containing `TIMESTAMP` is Azure).
pub fn load_trace(path: &Path, format: Option<TraceFormat>) -> Result<Trace, WorkloadError> {
    if path.is_dir() {
        return match format {
            None | Some(TraceFormat::Weka) => Ok(Trace::Sessions(load_weka(path)?)),
            Some(_) => Err(WorkloadError::UnknownFormat {
                path: path.to_path_buf(),
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
            match detect(&text) {
                Some(TraceFormat::Weka) => Ok(Trace::Sessions(parse_weka_str(&text, path)?)),
                Some(f @ TraceFormat::Mooncake) => Ok(Trace::Requests {
                    format: f,
                    requests: parse_mooncake_str(&text, path)?,
                }),
                Some(f @ TraceFormat::Azure) => Ok(Trace::Requests {
                    format: f,
                    requests: parse_azure_str(&text, path)?,
                }),
                None => Err(WorkloadError::UnknownFormat {
                    path: path.to_path_buf(),
                }),
            }
        }
    }
}

/// Guesses the format from the text's start.
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
        return None;
    }
    let header = body.lines().next().unwrap_or("").to_ascii_lowercase();
    if header.contains("timestamp") && header.contains("contexttokens") {
        return Some(TraceFormat::Azure);
    }
    None
}

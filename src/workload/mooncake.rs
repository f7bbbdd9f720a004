//! Mooncake FAST'25 trace loader: JSONL, one request per line, `timestamp` in milliseconds
//! from the trace start, `input_length`, `output_length`, `hash_ids` of 512-token blocks.

use std::path::Path;

use serde::Deserialize;

use super::error::{json_message, WorkloadError};
use super::source::read_text;
use super::types::{HashIds, TimedRequest};

/// Tokens per Mooncake hash block.
pub const MOONCAKE_BLOCK_SIZE: u32 = 512;

#[derive(Deserialize)]
struct RawMooncake {
    timestamp: Option<f64>,
    input_length: Option<u64>,
    output_length: Option<u64>,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Loads a Mooncake JSONL file (plain or gzip).
pub fn load_mooncake(path: &Path) -> Result<Vec<TimedRequest>, WorkloadError> {
    let text = read_text(path)?;
    parse_mooncake_str(&text, path)
}

/// Parses Mooncake JSONL text; `path` only labels errors.
pub fn parse_mooncake_str(text: &str, path: &Path) -> Result<Vec<TimedRequest>, WorkloadError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let invalid = |msg: String| WorkloadError::Invalid {
            path: path.to_path_buf(),
            line: line_no,
            msg,
        };
        let raw: RawMooncake = serde_json::from_str(line).map_err(|e| WorkloadError::Parse {
            path: path.to_path_buf(),
            line: line_no,
            msg: format!("bad Mooncake JSON: {}", json_message(&e)),
        })?;
        let ts = raw
            .timestamp
            .ok_or_else(|| invalid("missing field `timestamp`".into()))?;
        if !ts.is_finite() || ts < 0.0 {
            return Err(invalid(format!("field `timestamp` is {ts}")));
        }
        let count = |v: Option<u64>, field: &str| -> Result<u32, WorkloadError> {
            let x = v.ok_or_else(|| invalid(format!("missing field `{field}`")))?;
            u32::try_from(x).map_err(|_| invalid(format!("field `{field}` = {x} is too large")))
        };
        out.push(TimedRequest {
            t: ts / 1000.0,
            input_tokens: count(raw.input_length, "input_length")?,
            output_tokens: count(raw.output_length, "output_length")?,
            hash_ids: HashIds::from_ids(&raw.hash_ids),
            block_size: MOONCAKE_BLOCK_SIZE,
        });
    }
    if out.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

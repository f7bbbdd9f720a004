//! Weka trace loader (kv-cache-tester / AIPerf "weka_trace" / AgentX corpus format).
//!
//! A file holds one trace object, or many (JSONL, or any whitespace-separated sequence);
//! a directory is read file by file in name order. Requests give prefix blocks either as
//! `hash_ids` or as compact `hash_runs` (`[start, len]` runs).
//!
//! **Sub-agent time base.** A `type: "subagent"` marker carries `t`, `duration_ms` and its
//! own `requests`. In the kv-cache-tester capture the marker `t` is when the sub-agent's
//! result reached the parent (its *end*), and the inner `t` are relative to the sub-agent's
//! *start*: for 57 of the 59 completed markers of the shared corpus that follow a parent
//! request, `t - duration_ms/1000` falls 0.1–1.1 s after that request's recorded end (the
//! other two follow a long idle), and the last inner request ends 1–7 s before the marker.
//! Markers without `duration_ms` (`status: "async_launched"`) sit at their launch time.
//! So: `spawn_t = t - duration_ms/1000` when a duration is recorded, else `t`; `end_t =
//! t` when a duration is recorded, else the last inner request's recorded end. Inner times
//! are taken as relative (shifted by `spawn_t`) when the first one lies more than 1 s before
//! `spawn_t`, and as already absolute otherwise (the AgentX HF drop stores absolute times).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::{json_message, WorkloadError};
use super::source::{line_of, read_text};
use super::types::{HashIds, HashRun, Request, Session, Subagent};

/// Block size assumed when a trace does not state one.
pub const DEFAULT_BLOCK_SIZE: u32 = 64;

/// Guards against a malformed run list expanding into billions of ids.
const MAX_BLOCKS_PER_REQUEST: u64 = 1 << 22;

#[derive(Deserialize)]
struct RawTrace {
    id: Option<String>,
    block_size: Option<u32>,
    requests: Option<Vec<RawEntry>>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "type")]
    kind: Option<String>,
    t: Option<f64>,
    #[serde(rename = "in")]
    input: Option<u64>,
    out: Option<u64>,
    hash_ids: Option<Vec<u64>>,
    hash_runs: Option<Vec<(u64, u64)>>,
    api_time: Option<f64>,
    think_time: Option<f64>,
    agent_id: Option<String>,
    subagent_type: Option<String>,
    duration_ms: Option<f64>,
    requests: Option<Vec<RawEntry>>,
}

/// Loads a Weka file (JSON or JSONL, plain or gzip) or a directory of such files.
pub fn load_weka(path: &Path) -> Result<Vec<Session>, WorkloadError> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| WorkloadError::io(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && is_trace_name(p))
            .collect();
        files.sort();
        let mut out = Vec::new();
        for f in files {
            out.extend(load_weka_file(&f)?);
        }
        if out.is_empty() {
            return Err(WorkloadError::Empty {
                path: path.to_path_buf(),
            });
        }
        return Ok(out);
    }
    load_weka_file(path)
}

fn is_trace_name(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    [".json", ".jsonl", ".json.gz", ".jsonl.gz"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

fn load_weka_file(path: &Path) -> Result<Vec<Session>, WorkloadError> {
    let text = read_text(path)?;
    parse_weka_str(&text, path)
}

/// Parses Weka text; `path` only labels errors.
pub fn parse_weka_str(text: &str, path: &Path) -> Result<Vec<Session>, WorkloadError> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<RawTrace>();
    let mut out = Vec::new();
    // Line numbers are counted incrementally: one pass over the text in total.
    let (mut counted_to, mut line) = (0usize, 1usize);
    loop {
        let start = stream.byte_offset();
        let lead = text[start..].len() - text[start..].trim_start().len();
        let at = start + lead;
        line += line_of(&text[counted_to..at], at - counted_to) - 1;
        counted_to = at;
        match stream.next() {
            None => break,
            Some(Err(e)) => {
                return Err(WorkloadError::Parse {
                    path: path.to_path_buf(),
                    // The text ended inside the object: name the line it starts on.
                    line: if e.is_eof() { line } else { e.line() },
                    msg: format!("bad Weka JSON: {}", json_message(&e)),
                });
            }
            Some(Ok(raw)) => {
                let ctx = Ctx { path, line };
                out.push(convert_trace(raw, out.len(), &ctx)?);
            }
        }
    }
    if out.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

struct Ctx<'a> {
    path: &'a Path,
    line: usize,
}

impl Ctx<'_> {
    fn invalid(&self, msg: String) -> WorkloadError {
        WorkloadError::Invalid {
            path: self.path.to_path_buf(),
            line: self.line,
            msg,
        }
    }
}

fn convert_trace(raw: RawTrace, index: usize, ctx: &Ctx) -> Result<Session, WorkloadError> {
    let id = raw.id.unwrap_or_else(|| format!("trace#{index}"));
    let block_size = raw.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    if block_size == 0 {
        return Err(ctx.invalid(format!("trace `{id}`: block_size is 0")));
    }
    let entries = raw
        .requests
        .ok_or_else(|| ctx.invalid(format!("trace `{id}`: missing field `requests`")))?;
    convert_chain(entries, &id, 0.0, block_size, &id, ctx)
}

/// Converts one chain of entries; `offset` is added to every `t` (the chain's time base).
fn convert_chain(
    entries: Vec<RawEntry>,
    chain_id: &str,
    offset: f64,
    block_size: u32,
    where_: &str,
    ctx: &Ctx,
) -> Result<Session, WorkloadError> {
    let mut requests = Vec::new();
    let mut subagents = Vec::new();
    // A chain's entries are its turns in order: their times never go back.
    let mut previous_t = 0.0;
    for (i, e) in entries.into_iter().enumerate() {
        let at = format!("{where_} request {i}");
        let raw_t = finite(e.t, "t", &at, ctx)?;
        if raw_t < 0.0 {
            return Err(ctx.invalid(format!(
                "{at}: field `t` is {raw_t}: times are seconds from the chain's start"
            )));
        }
        if raw_t < previous_t {
            return Err(ctx.invalid(format!(
                "{at}: field `t` is {raw_t}, before the previous entry's {previous_t}: a \
                 chain's entries are its turns in time order"
            )));
        }
        previous_t = raw_t;
        let t = raw_t + offset;
        match e.kind.as_deref() {
            Some("subagent") => {
                let inner = e
                    .requests
                    .ok_or_else(|| ctx.invalid(format!("{at}: sub-agent without `requests`")))?;
                let duration = match e.duration_ms {
                    Some(d) if d.is_finite() && d >= 0.0 => Some(d / 1000.0),
                    Some(d) => return Err(ctx.invalid(format!("{at}: bad `duration_ms` {d}"))),
                    None => None,
                };
                let spawn_t = duration.map_or(t, |d| t - d);
                let first_t = inner.first().and_then(|r| r.t).unwrap_or(0.0);
                let base = if first_t + offset < spawn_t - 1.0 {
                    spawn_t
                } else {
                    offset
                };
                let agent_id = e.agent_id.unwrap_or_else(|| format!("agent#{i}"));
                let sub_id = format!("{chain_id}/{agent_id}");
                let session = convert_chain(inner, &sub_id, base, block_size, &at, ctx)?;
                let last_end = session
                    .requests
                    .last()
                    .map_or(spawn_t, |r| r.recorded_end());
                let end_t = if duration.is_some() { t } else { last_end };
                subagents.push(Subagent {
                    after_request: requests.len(),
                    marker_t: t,
                    spawn_t,
                    end_t,
                    agent_id,
                    subagent_type: e.subagent_type.unwrap_or_default(),
                    session,
                });
            }
            kind => {
                let input = tokens(e.input, "in", &at, ctx)?;
                if input == 0 {
                    // An empty output is a recorded turn (the real traces have some); an empty
                    // prompt is not a request any server takes.
                    return Err(ctx.invalid(format!(
                        "{at}: field `in` is 0: a request has at least one prompt token"
                    )));
                }
                let output = tokens(e.out, "out", &at, ctx)?;
                let hash_ids = match (e.hash_ids, e.hash_runs) {
                    (Some(ids), _) => HashIds::from_ids(&ids),
                    (None, Some(runs)) => expand_runs(&runs, &at, ctx)?,
                    (None, None) => {
                        return Err(
                            ctx.invalid(format!("{at}: missing field `hash_ids` or `hash_runs`"))
                        )
                    }
                };
                requests.push(Request {
                    t,
                    input_tokens: input,
                    output_tokens: output,
                    api_time: non_negative(e.api_time, "api_time", &at, ctx)?,
                    think_time: non_negative(e.think_time, "think_time", &at, ctx)?,
                    hash_ids,
                    streaming: kind == Some("s"),
                });
            }
        }
    }
    Ok(Session {
        id: chain_id.to_string(),
        block_size,
        requests,
        subagents,
    })
}

fn finite(v: Option<f64>, field: &str, at: &str, ctx: &Ctx) -> Result<f64, WorkloadError> {
    match v {
        Some(x) if x.is_finite() => Ok(x),
        Some(x) => Err(ctx.invalid(format!("{at}: field `{field}` is {x}"))),
        None => Err(ctx.invalid(format!("{at}: missing field `{field}`"))),
    }
}

fn non_negative(
    v: Option<f64>,
    field: &str,
    at: &str,
    ctx: &Ctx,
) -> Result<Option<f64>, WorkloadError> {
    match v {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
        Some(x) => Err(ctx.invalid(format!("{at}: field `{field}` is {x}"))),
        None => Ok(None),
    }
}

fn tokens(v: Option<u64>, field: &str, at: &str, ctx: &Ctx) -> Result<u32, WorkloadError> {
    let x = v.ok_or_else(|| ctx.invalid(format!("{at}: missing field `{field}`")))?;
    u32::try_from(x).map_err(|_| ctx.invalid(format!("{at}: field `{field}` = {x} is too large")))
}

fn expand_runs(runs: &[(u64, u64)], at: &str, ctx: &Ctx) -> Result<HashIds, WorkloadError> {
    let mut total = 0u64;
    let mut out = Vec::with_capacity(runs.len());
    for &(start, len) in runs {
        total = total.saturating_add(len);
        if total > MAX_BLOCKS_PER_REQUEST || start.checked_add(len).is_none() {
            return Err(ctx.invalid(format!(
                "{at}: `hash_runs` run [{start}, {len}] is out of range"
            )));
        }
        // `total` bounds `len` below 2^22, so it fits u32.
        out.push(HashRun {
            start,
            len: len as u32,
        });
    }
    Ok(HashIds::from_runs(out))
}

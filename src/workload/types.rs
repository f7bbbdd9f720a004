//! In-memory shapes of loaded traces: Weka sessions (closed loop) and flat timed requests
//! (open loop). Prefix hashes are kept as runs so a 50k-request corpus stays small.

/// A run of consecutive prefix-block hash ids: `start, start+1, …, start+len-1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashRun {
    pub start: u64,
    pub len: u32,
}

/// Prefix-block hash ids stored as runs of consecutive integers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HashIds {
    runs: Vec<HashRun>,
}

impl HashIds {
    /// Compresses an explicit id list into runs.
    pub fn from_ids(ids: &[u64]) -> Self {
        let mut out = Self::default();
        for &id in ids {
            out.push(id);
        }
        out
    }

    /// Builds from runs; zero-length runs are dropped.
    pub fn from_runs(runs: impl IntoIterator<Item = HashRun>) -> Self {
        let mut out = Self::default();
        for r in runs {
            if r.len > 0 {
                out.push_run(r);
            }
        }
        out
    }

    /// Appends one id, extending the last run when it is consecutive.
    pub fn push(&mut self, id: u64) {
        self.push_run(HashRun { start: id, len: 1 });
    }

    /// Appends `len` consecutive ids starting at `start`.
    pub fn push_range(&mut self, start: u64, len: u32) {
        if len > 0 {
            self.push_run(HashRun { start, len });
        }
    }

    /// The first `n` ids (all of them when there are fewer).
    pub fn prefix(&self, n: usize) -> HashIds {
        let mut out = HashIds::default();
        let mut left = n;
        for r in &self.runs {
            if left == 0 {
                break;
            }
            let take = (r.len as usize).min(left);
            out.push_range(r.start, take as u32);
            left -= take;
        }
        out
    }

    fn push_run(&mut self, run: HashRun) {
        if let Some(last) = self.runs.last_mut() {
            if last.start.checked_add(u64::from(last.len)) == Some(run.start) {
                if let Some(len) = last.len.checked_add(run.len) {
                    last.len = len;
                    return;
                }
            }
        }
        self.runs.push(run);
    }

    /// Number of block ids.
    pub fn len(&self) -> usize {
        self.runs.iter().map(|r| r.len as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn runs(&self) -> &[HashRun] {
        &self.runs
    }

    /// The ids in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (0..u64::from(r.len)).map(move |i| r.start.wrapping_add(i)))
    }

    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

/// One recorded LLM call of a Weka session.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Seconds since the root session's start (sub-agent requests already shifted to this base).
    pub t: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Seconds the original API call took; `None` when the trace did not record it.
    pub api_time: Option<f64>,
    /// Recorded client-side delay before this request, seconds.
    pub think_time: Option<f64>,
    pub hash_ids: HashIds,
    /// `type: "s"` (streaming) in the trace.
    pub streaming: bool,
}

impl Request {
    /// Recorded end of the call: `t + api_time` (missing api_time counts as 0).
    pub fn recorded_end(&self) -> f64 {
        self.t + self.api_time.unwrap_or(0.0)
    }
}

/// A sub-agent spawned by a session, with its own chain of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Subagent {
    /// Spawn point: the number of the parent's requests that precede the marker, so the
    /// sub-agent starts once parent request `after_request - 1` has completed.
    pub after_request: usize,
    /// The marker's raw `t` (absolute session seconds).
    pub marker_t: f64,
    /// When the sub-agent started (absolute session seconds); see `weka` for the rule.
    pub spawn_t: f64,
    /// When the sub-agent's result was available to the parent (absolute session seconds).
    pub end_t: f64,
    pub agent_id: String,
    pub subagent_type: String,
    /// The sub-agent's requests (and any nested sub-agents); shares the parent's hash namespace.
    pub session: Session,
}

/// One Weka trace: an agentic session with ordered requests and nested sub-agents.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub id: String,
    /// Tokens per prefix hash block (64 for the Weka corpus).
    pub block_size: u32,
    pub requests: Vec<Request>,
    /// Sorted by `after_request`, then by marker order in the trace.
    pub subagents: Vec<Subagent>,
}

impl Session {
    /// Requests in this session and all nested sub-agents.
    pub fn total_requests(&self) -> usize {
        self.requests.len()
            + self
                .subagents
                .iter()
                .map(|s| s.session.total_requests())
                .sum::<usize>()
    }

    /// Number of sub-agents at any depth.
    pub fn total_subagents(&self) -> usize {
        self.subagents.len()
            + self
                .subagents
                .iter()
                .map(|s| s.session.total_subagents())
                .sum::<usize>()
    }

    /// Every request of the tree with its depth (0 = root), depth first, parents before children.
    pub fn all_requests(&self) -> Vec<(usize, &Request)> {
        let mut out = Vec::with_capacity(self.total_requests());
        self.collect(0, &mut out);
        out
    }

    fn collect<'a>(&'a self, depth: usize, out: &mut Vec<(usize, &'a Request)>) {
        out.extend(self.requests.iter().map(|r| (depth, r)));
        for s in &self.subagents {
            s.session.collect(depth + 1, out);
        }
    }
}

/// One request of an open-loop trace (Mooncake, Azure).
#[derive(Debug, Clone, PartialEq)]
pub struct TimedRequest {
    /// Arrival, seconds from the start of the trace.
    pub t: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub hash_ids: HashIds,
    /// Tokens per hash block; 0 when the trace carries no prefix information (Azure).
    pub block_size: u32,
}

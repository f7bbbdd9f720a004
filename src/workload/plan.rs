//! Turns one session tree into the dependency graph the AgentX replay walks. Every request
//! is a node; its predecessors are the previous request of the same chain, the request after
//! which its sub-agent was spawned (for a sub-agent's first request), and the last request of
//! each sub-agent recorded as ending before it (the join). A node is sent once all its
//! predecessors have completed, plus its end-to-start gap: `t - (latest recorded end among
//! its predecessors)`, clamped to `[0, idle_cap]`. Nodes with no predecessor are gated by the
//! tree start instead, with the gap measured from the recorded time the start stands for.

use std::sync::Arc;

use super::types::{HashIds, Session};

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Shared with every issue of this node, so issuing copies no ids.
    pub hash_ids: Arc<HashIds>,
    pub depth: u32,
    pub warmup: bool,
    /// Number of predecessors.
    pub preds: u32,
    /// Whether the tree start gates this node (it then has no predecessors).
    pub anchored: bool,
    /// Capped end-to-start gap after the last predecessor (or the tree start).
    pub gap: f64,
}

/// A session tree's nodes and their successor lists, stored flat: one allocation per plan
/// rather than one per node (plans are built for most trees a run draws, and dropped at its
/// end).
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub nodes: Vec<Node>,
    /// Successors of node `i`: `succs[succ_start[i]..succ_start[i + 1]]`, in wiring order.
    succs: Vec<usize>,
    succ_start: Vec<usize>,
}

impl Plan {
    pub fn succs(&self, node: usize) -> &[usize] {
        match (self.succ_start.get(node), self.succ_start.get(node + 1)) {
            (Some(&a), Some(&b)) => self.succs.get(a..b).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Counting sort of the `(from, to)` edges by `from`, keeping each node's wiring order.
    fn from_edges(nodes: Vec<Node>, edges: &[(usize, usize)]) -> Self {
        let mut succ_start = vec![0usize; nodes.len() + 1];
        for &(from, _) in edges {
            succ_start[from + 1] += 1;
        }
        for i in 0..nodes.len() {
            succ_start[i + 1] += succ_start[i];
        }
        let mut fill = succ_start.clone();
        let mut succs = vec![0usize; edges.len()];
        for &(from, to) in edges {
            succs[fill[from]] = to;
            fill[from] += 1;
        }
        Self {
            nodes,
            succs,
            succ_start,
        }
    }
}

#[derive(Clone, Copy)]
enum Entry {
    /// Gated by the tree start; the value is the recorded time the start stands for.
    Anchor(f64),
    /// Gated by a node's completion; the value is that node's recorded end.
    After(usize, f64),
}

/// Which part of the root chain a replay covers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cut {
    /// First root request replayed.
    pub first: usize,
    /// Whether `first` is a warm-up turn.
    pub first_is_warmup: bool,
}

pub(crate) fn build(session: &Session, cut: Cut, idle_cap: f64) -> Plan {
    let mut b = Builder {
        nodes: Vec::with_capacity(session.total_requests()),
        edges: Vec::with_capacity(session.total_requests()),
        cap: idle_cap,
    };
    let anchor_t = session
        .requests
        .get(cut.first)
        .map(|r| r.t)
        .unwrap_or_else(|| session.subagents.first().map_or(0.0, |s| s.spawn_t));
    b.chain(session, 0, cut, Entry::Anchor(anchor_t));
    Plan::from_edges(b.nodes, &b.edges)
}

struct Builder {
    nodes: Vec<Node>,
    /// `(predecessor, successor)` in wiring order.
    edges: Vec<(usize, usize)>,
    cap: f64,
}

impl Builder {
    fn capped(&self, gap: f64) -> f64 {
        gap.max(0.0).min(self.cap)
    }

    /// Wires `node` (recorded at `t`) to its predecessors and sets its gap.
    fn wire(&mut self, node: usize, t: f64, entry: Entry, joins: &[(usize, f64)]) {
        let mut latest = f64::NEG_INFINITY;
        match entry {
            Entry::Anchor(ta) if joins.is_empty() => {
                self.nodes[node].anchored = true;
                latest = ta;
            }
            Entry::Anchor(_) => {}
            Entry::After(p, end) => {
                self.edges.push((p, node));
                self.nodes[node].preds += 1;
                latest = end;
            }
        }
        for &(p, end) in joins {
            self.edges.push((p, node));
            self.nodes[node].preds += 1;
            latest = latest.max(end);
        }
        self.nodes[node].gap = self.capped(t - latest);
    }

    /// Adds one chain and its sub-agents; returns its last node and that request's recorded end.
    fn chain(&mut self, s: &Session, depth: u32, cut: Cut, entry: Entry) -> Option<(usize, f64)> {
        let n = s.requests.len();
        let mut prev: Option<(usize, f64)> = None;
        // Sub-agents not joined yet: (last node, its recorded end, sub-agent end time).
        let mut open: Vec<(usize, f64, f64)> = Vec::new();
        let mut subs = s.subagents.iter().peekable();
        for i in 0..=n {
            while let Some(sub) = subs.next_if(|sub| sub.after_request <= i) {
                // A sub-agent launched by a request before the cut is not replayed.
                if cut.first > 0 && sub.after_request <= cut.first {
                    continue;
                }
                let sub_entry = match prev {
                    Some((p, end)) => Entry::After(p, end),
                    None => entry,
                };
                let whole = Cut {
                    first: 0,
                    first_is_warmup: false,
                };
                if let Some((last, last_end)) =
                    self.chain(&sub.session, depth + 1, whole, sub_entry)
                {
                    open.push((last, last_end, sub.end_t));
                }
            }
            if i == n {
                break;
            }
            if i < cut.first {
                continue;
            }
            let r = &s.requests[i];
            let node = self.nodes.len();
            self.nodes.push(Node {
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                hash_ids: Arc::new(r.hash_ids.clone()),
                depth,
                warmup: cut.first_is_warmup && i == cut.first,
                preds: 0,
                anchored: false,
                gap: 0.0,
            });
            let mut joins = Vec::new();
            open.retain(|&(last, last_end, end_t)| {
                let ended = end_t <= r.t + 1e-6;
                if ended {
                    joins.push((last, last_end));
                }
                !ended
            });
            let own = match prev {
                Some((p, end)) => Entry::After(p, end),
                None => entry,
            };
            self.wire(node, r.t, own, &joins);
            prev = Some((node, r.recorded_end()));
        }
        prev
    }
}

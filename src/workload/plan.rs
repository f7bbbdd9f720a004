//! Turns one session tree into the dependency graph the AgentX replay walks: every request
//! is a node; an edge `a -> b` with gap `g` means "send b no earlier than g seconds after a
//! completes". Edges: the previous request of the same chain (end-to-start gap
//! `t_b - (t_a + api_time_a)`), the request after which a sub-agent was spawned (to the
//! sub-agent's first request), and a sub-agent's last request (to the first parent request
//! recorded after the sub-agent ended: the join). Gaps are clamped to `[0, idle_cap]`.

use super::types::{HashIds, Session};

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub hash_ids: HashIds,
    pub depth: u32,
    pub warmup: bool,
    /// Number of incoming edges.
    pub preds: u32,
    /// For nodes the tree start gates: capped gap from the tree start.
    pub anchor_gap: Option<f64>,
    /// Outgoing edges: (node, capped gap).
    pub succs: Vec<(usize, f64)>,
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

pub(crate) fn build(session: &Session, cut: Cut, idle_cap: f64) -> Vec<Node> {
    let mut b = Builder {
        nodes: Vec::new(),
        cap: idle_cap,
    };
    let anchor_t = session
        .requests
        .get(cut.first)
        .map(|r| r.t)
        .unwrap_or_else(|| session.subagents.first().map_or(0.0, |s| s.spawn_t));
    b.chain(session, 0, cut, Entry::Anchor(anchor_t));
    b.nodes
}

struct Builder {
    nodes: Vec<Node>,
    cap: f64,
}

impl Builder {
    fn capped(&self, gap: f64) -> f64 {
        gap.max(0.0).min(self.cap)
    }

    fn gate(&mut self, entry: Entry, node: usize, t: f64) {
        match entry {
            Entry::Anchor(ta) => self.nodes[node].anchor_gap = Some(self.capped(t - ta)),
            Entry::After(p, end) => self.edge(p, node, t - end),
        }
    }

    fn edge(&mut self, from: usize, to: usize, gap: f64) {
        let g = self.capped(gap);
        self.nodes[from].succs.push((to, g));
        self.nodes[to].preds += 1;
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
                hash_ids: r.hash_ids.clone(),
                depth,
                warmup: cut.first_is_warmup && i == cut.first,
                preds: 0,
                anchor_gap: None,
                succs: Vec::new(),
            });
            match prev {
                Some((p, end)) => self.edge(p, node, r.t - end),
                None => self.gate(entry, node, r.t),
            }
            let mut k = 0;
            while k < open.len() {
                let (last, last_end, end_t) = open[k];
                if end_t <= r.t + 1e-6 {
                    self.edge(last, node, r.t - last_end);
                    open.remove(k);
                } else {
                    k += 1;
                }
            }
            prev = Some((node, r.recorded_end()));
        }
        prev
    }
}

//! AgentX closed-loop replay of Weka sessions (the rules of AIPerf's
//! `inferencex-agentx-mvp` scenario), as a pure state machine driven by the caller's `now`.
//!
//! - `concurrency` lanes; each holds one live session tree (root plus sub-agents; sub-agents
//!   take no extra lane, so in-flight requests may exceed the lane count during fan-out).
//!   When a tree drains the lane draws the next session at once and replays it from turn 0.
//!   Sessions are drawn from a seeded shuffle of the list, reshuffled every pass.
//! - A lane's first session starts at a random point `t* = t_0 + f (t_last - t_0)` of its
//!   root chain, `f` uniform in `start_fraction`; replay begins at the first root request
//!   with `t >= t*`, and with `warmup` the request before it is sent first, flagged as
//!   warm-up. Sub-agents launched before the replayed part are skipped; those launched by
//!   the warm-up turn itself are replayed and not flagged.
//! - A request is sent after everything it depends on completes (see `plan`), after the
//!   recorded end-to-start gap `max(0, t_k - t_{k-1} - api_time_{k-1})` capped at
//!   `idle_cap_s`. `max_tokens` is the recorded output length (at least 1).

use std::collections::BinaryHeap;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::error::ReplayError;
use super::issue::{drain_due, Issue, Pending, Replay};
use super::ledger::Ledger;
use super::plan::{build, Cut, Plan};
use super::prefix::PrefixHashes;
use super::types::Session;

/// The AgentX replay settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRules {
    /// Number of lanes (live session trees).
    pub concurrency: usize,
    /// Range of the random start fraction of each lane's first session, within `[0, 1]`.
    pub start_fraction: (f64, f64),
    /// Cap on every replayed gap, seconds (`f64::INFINITY` for none).
    pub idle_cap_s: f64,
    /// Send the turn before the start point as a flagged warm-up turn.
    pub warmup: bool,
}

impl Default for ReplayRules {
    /// `inferencex-agentx-mvp`: uniform start over 0–100 %, 10 s idle cap (AIPerf FAQ), warm-up on.
    fn default() -> Self {
        Self {
            concurrency: 1,
            start_fraction: (0.0, 1.0),
            idle_cap_s: 10.0,
            warmup: true,
        }
    }
}

impl ReplayRules {
    fn validate(&self) -> Result<(), ReplayError> {
        let (lo, hi) = self.start_fraction;
        if self.concurrency == 0 {
            return Err(ReplayError::Rules("concurrency must be at least 1".into()));
        }
        if !(0.0..=1.0).contains(&lo) || !(0.0..=1.0).contains(&hi) || lo > hi {
            return Err(ReplayError::Rules(format!(
                "start_fraction ({lo}, {hi}) must satisfy 0 <= lo <= hi <= 1"
            )));
        }
        if self.idle_cap_s.is_nan() || self.idle_cap_s < 0.0 {
            return Err(ReplayError::Rules(format!(
                "idle_cap_s {} must be >= 0",
                self.idle_cap_s
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct NodeState {
    preds_left: u32,
    /// Latest completion among finished predecessors (the tree start for anchored nodes).
    last_done: f64,
}

#[derive(Debug, Default)]
struct Lane {
    instance: u64,
    session: usize,
    /// The tree's plan (shared with every other replay of the same session and cut).
    plan: Arc<Plan>,
    /// Per node of `plan`.
    nodes: Vec<NodeState>,
    remaining: usize,
}

/// Closed-loop AgentX replay. Deterministic: the same sessions, rules, seed and sequence of
/// `start`/`pop_due`/`on_complete` calls produce the same issues.
#[derive(Debug)]
pub struct AgentxReplay {
    sessions: Arc<[Session]>,
    rules: ReplayRules,
    rng: SmallRng,
    order: Vec<usize>,
    order_pos: usize,
    lanes: Vec<Lane>,
    heap: BinaryHeap<Pending>,
    /// Each issue's `(lane, node)` while scheduled or in flight.
    ledger: Ledger<(usize, usize)>,
    next_id: u64,
    next_instance: u64,
    drawing: bool,
    /// Plans of whole sessions (replayed from turn 0), built on first use: every tree after a
    /// lane's first replays a whole session, and building its plan anew each time was most
    /// of the replay's cost.
    whole_plans: Vec<Option<Arc<Plan>>>,
    /// Nodes made ready by one completion (reused).
    ready: Vec<usize>,
}

impl AgentxReplay {
    /// Fails when the rules are out of range or no session has a request.
    pub fn new(
        sessions: Arc<[Session]>,
        rules: ReplayRules,
        seed: u64,
    ) -> Result<Self, ReplayError> {
        rules.validate()?;
        if !sessions.iter().any(|s| s.total_requests() > 0) {
            return Err(ReplayError::NoSessions);
        }
        let order = (0..sessions.len()).collect::<Vec<_>>();
        let whole_plans = vec![None; sessions.len()];
        Ok(Self {
            order_pos: order.len(),
            order,
            sessions,
            rules,
            rng: SmallRng::seed_from_u64(seed),
            lanes: Vec::new(),
            heap: BinaryHeap::new(),
            ledger: Ledger::default(),
            next_id: 0,
            next_instance: 0,
            drawing: true,
            whole_plans,
            ready: Vec::new(),
        })
    }

    pub fn rules(&self) -> &ReplayRules {
        &self.rules
    }

    /// Lanes stop drawing new sessions once their current tree drains.
    pub fn stop_new_sessions(&mut self) {
        self.drawing = false;
    }

    /// Session index each lane is replaying (`None` for a lane that has stopped).
    pub fn lane_sessions(&self) -> Vec<Option<usize>> {
        self.lanes
            .iter()
            .map(|l| (l.remaining > 0).then_some(l.session))
            .collect()
    }

    fn draw(&mut self) -> usize {
        if self.order_pos >= self.order.len() {
            for i in (1..self.order.len()).rev() {
                let j = self.rng.random_range(0..=i);
                self.order.swap(i, j);
            }
            self.order_pos = 0;
        }
        let s = self.order[self.order_pos];
        self.order_pos += 1;
        s
    }

    /// Root-chain cut for a random start fraction `f`.
    fn cut_at(&self, session: &Session, f: f64) -> Cut {
        let reqs = &session.requests;
        let (Some(first), Some(last)) = (reqs.first(), reqs.last()) else {
            return Cut {
                first: 0,
                first_is_warmup: false,
            };
        };
        let t_star = first.t + f * (last.t - first.t);
        let k = reqs
            .iter()
            .position(|r| r.t >= t_star - 1e-9)
            .unwrap_or(reqs.len() - 1);
        if self.rules.warmup && k > 0 {
            Cut {
                first: k - 1,
                first_is_warmup: true,
            }
        } else {
            Cut {
                first: k,
                first_is_warmup: false,
            }
        }
    }

    /// Starts a new tree on `lane` at `now`; retries past sessions that yield no request.
    fn begin_tree(&mut self, lane: usize, now: f64, random_start: bool) {
        for _ in 0..=self.sessions.len() {
            let s = self.draw();
            let sessions = Arc::clone(&self.sessions);
            let session = &sessions[s];
            let cut = if random_start {
                let (lo, hi) = self.rules.start_fraction;
                let f = lo + (hi - lo) * self.rng.random::<f64>();
                self.cut_at(session, f)
            } else {
                Cut {
                    first: 0,
                    first_is_warmup: false,
                }
            };
            let plan = self.plan(s, session, cut);
            if plan.nodes.is_empty() {
                continue;
            }
            let instance = self.next_instance;
            self.next_instance += 1;
            let l = &mut self.lanes[lane];
            l.nodes.clear();
            l.nodes.extend(plan.nodes.iter().map(|node| NodeState {
                preds_left: node.preds,
                last_done: if node.anchored {
                    now
                } else {
                    f64::NEG_INFINITY
                },
            }));
            l.instance = instance;
            l.session = s;
            l.remaining = plan.nodes.len();
            l.plan = plan;
            for i in 0..self.lanes[lane].nodes.len() {
                if self.lanes[lane].nodes[i].preds_left == 0 {
                    self.schedule(lane, i, now);
                }
            }
            return;
        }
    }

    /// The plan for `session` cut at `cut`; whole-session plans are built once.
    fn plan(&mut self, s: usize, session: &Session, cut: Cut) -> Arc<Plan> {
        let whole = cut.first == 0 && !cut.first_is_warmup;
        if whole {
            if let Some(Some(p)) = self.whole_plans.get(s) {
                return Arc::clone(p);
            }
        }
        let plan = Arc::new(build(session, cut, self.rules.idle_cap_s));
        if whole {
            if let Some(slot) = self.whole_plans.get_mut(s) {
                *slot = Some(Arc::clone(&plan));
            }
        }
        plan
    }

    fn schedule(&mut self, lane: usize, node: usize, now: f64) {
        let l = &self.lanes[lane];
        let st = &l.nodes[node];
        let n = &l.plan.nodes[node];
        let id = self.next_id;
        self.next_id += 1;
        let issue = Issue {
            id,
            lane: Some(lane),
            session: l.session,
            instance: l.instance,
            depth: n.depth,
            input_tokens: n.input_tokens,
            max_tokens: n.output_tokens.max(1),
            hash_ids: PrefixHashes::scoped(Arc::clone(&n.hash_ids), l.instance),
            block_size: self.sessions[l.session].block_size,
            warmup: n.warmup,
            send_at: (st.last_done + n.gap).max(now),
        };
        self.ledger.schedule(id, (lane, node));
        self.heap.push(Pending(issue));
    }
}

impl Replay for AgentxReplay {
    /// Call once: draws every lane's first session and schedules its first turn(s).
    fn start(&mut self, now: f64) {
        self.lanes = (0..self.rules.concurrency)
            .map(|_| Lane::default())
            .collect();
        for lane in 0..self.rules.concurrency {
            self.begin_tree(lane, now, true);
        }
    }

    fn next_due(&self) -> Option<f64> {
        self.heap.peek().map(|p| p.0.send_at)
    }

    fn pop_due(&mut self, now: f64) -> Vec<Issue> {
        let due = drain_due(&mut self.heap, now);
        for issue in &due {
            self.ledger.send(issue.id);
        }
        due
    }

    fn on_complete(&mut self, id: u64, now: f64) -> Result<(), ReplayError> {
        let (lane, node) = self
            .ledger
            .complete(id)
            .ok_or(ReplayError::UnknownIssue(id))?;
        let l = &mut self.lanes[lane];
        l.remaining -= 1;
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        for &next in l.plan.succs(node) {
            let st = &mut l.nodes[next];
            st.preds_left -= 1;
            st.last_done = st.last_done.max(now);
            if st.preds_left == 0 {
                ready.push(next);
            }
        }
        for &next in &ready {
            self.schedule(lane, next, now);
        }
        self.ready = ready;
        if self.lanes[lane].remaining == 0 && self.drawing {
            self.begin_tree(lane, now, false);
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.ledger.in_flight()
    }

    fn is_finished(&self) -> bool {
        !self.drawing && self.ledger.in_flight() == 0 && self.ledger.scheduled() == 0
    }
}

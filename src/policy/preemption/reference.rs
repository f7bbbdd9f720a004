//! The preemption controller's rules (SPEC §4.3) written plainly: the readable
//! specification of `GenPreemption::step`.
//!
//! Every pass scans every resident and sorts what it must order: no estimate, no hint kept
//! from the last pass, no early stop, no copy of a record. It shares with the controller only
//! the rules themselves, each defined once: eligibility (`victim::Eligibility`), the victim
//! rules (`victim::VictimKey`), laxity, the objective and the credit (`objective`), the
//! at-risk rule (`risk`), g (`controller`) and the per-request pause limits
//! (`Record::may_pause`). The property tests (`tests/reference.rs`) run both over generated
//! multi-pass histories, in both modes and under every victim rule, and require the same
//! decisions and the same controller state every pass: either can be read, the other trusted.

use std::collections::BTreeMap;

use super::controller::WindowGain;
use super::objective::{laxity, met_target, Credit, RateState};
use super::record::Record;
use super::victim::{largest_slack_first, Candidate, Eligibility, VictimKey};
use super::{
    paused_cap, risk, DecodeStats, Departure, Mode, PauseKind, PreemptDecision, PreemptParams,
    Resident, StepView, GUARD_FRACTION_OF_D, MAX_PAUSE_BEFORE_D_S, MAX_PAUSE_FRACTION_OF_D,
    MIN_DECODE_BEFORE_D_S, MIN_DECODE_FRACTION_OF_D, SLACK_FORCED_RESUME_FRACTION_OF_D,
    SLACK_TIER_MIN_FRACTION_OF_D,
};
use crate::ids::RequestId;

/// The controller by the SPEC's text: the same inputs and decisions as `GenPreemption`.
#[derive(Debug, Clone)]
pub struct ReferencePreemption {
    pub(super) params: PreemptParams,
    /// D and R0.
    pub(super) stats: DecodeStats,
    pub(super) gain: WindowGain,
    pub(super) credit: Credit,
    /// The pause history of every request paused so far and still known, by id. A request
    /// is paused when its record has an open pause.
    pub(super) records: BTreeMap<RequestId, Record>,
}

impl ReferencePreemption {
    pub fn new(params: PreemptParams) -> Self {
        let budget = match params.mode {
            Mode::TpotBudget(b) => b,
            _ => 0.0,
        };
        Self {
            params,
            stats: DecodeStats::default(),
            gain: WindowGain::new(budget, params.g0).stepping_from(params.gain_from),
            credit: Credit::default(),
            records: BTreeMap::new(),
        }
    }

    /// Preemption off at run time: every paused request resumes at the next step.
    pub fn disable(&mut self) {
        self.params.mode = Mode::Off;
    }

    /// g (`tpot_budget` only).
    pub fn g(&self) -> Option<f64> {
        matches!(self.params.mode, Mode::TpotBudget(_)).then(|| self.gain.g())
    }

    /// The sacrifice credit (`target_output_tps` only).
    pub fn credit(&self) -> Option<f64> {
        matches!(self.params.mode, Mode::TargetOutputTps(_)).then(|| self.credit.value())
    }

    pub fn d(&self) -> Option<f64> {
        self.stats.d()
    }

    /// The paused ids, in id order.
    pub fn paused_ids(&self) -> Vec<RequestId> {
        self.records
            .iter()
            .filter(|(_, r)| r.paused.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Pauses so far of a known request.
    pub fn pauses_of(&self, id: RequestId) -> u32 {
        self.records.get(&id).map_or(0, |r| u32::from(r.pauses))
    }

    /// Whether the request was ever sacrificed (target mode).
    pub fn sacrificed(&self, id: RequestId) -> bool {
        self.records.get(&id).is_some_and(|r| r.sacrificed)
    }

    /// The kind of a request's open pause.
    pub fn pause_kind(&self, id: RequestId) -> Option<PauseKind> {
        self.records.get(&id).and_then(|r| r.paused).map(|(_, k)| k)
    }

    /// One pass: track, resume, pause.
    pub fn step(&mut self, view: &StepView) -> PreemptDecision {
        let now = view.now;

        // 1. Track: every request that left since the last pass.
        for departure in view.departed {
            self.track(departure, view.queue.target_formed);
        }

        // 2. Resume.
        let active_before = view
            .residents
            .iter()
            .filter(|r| !self.is_paused(r.id))
            .count();
        let (resumes, forced_resumes) = self.resumes(view);
        // A paused request that left without a departure record is forgotten.
        self.records
            .retain(|id, r| r.paused.is_none() || resident(view, *id).is_some());
        for &id in resumes.iter().chain(&forced_resumes) {
            let iters = resident(view, id).map_or(0, |r| r.decode_iters);
            if let Some(record) = self.records.get_mut(&id) {
                record.end_pause(iters, now);
            }
        }
        let mut active = active_before + resumes.len() + forced_resumes.len();
        let mut decision = PreemptDecision {
            resumes,
            forced_resumes,
            ..PreemptDecision::default()
        };

        // 3. Pause: at most one, when no slot is free, the paused cap has room, the head
        // is at risk and every resident and the head can finish in the KV pool.
        if self.params.mode.is_on() {
            let w = self.window();
            decision.window = w;
            let paused = self.records.values().filter(|r| r.paused.is_some()).count();
            if view.queue.target_formed
                && active == self.params.max_active as usize
                && paused < paused_cap(self.params.max_active) as usize
                && risk::head_at_risk(self.params.mode, view.queue.head_slack, w)
                && view.kv.fits_head()
            {
                if let Some((id, kind)) = self.victim(view) {
                    self.records.entry(id).or_default().start_pause(kind, now);
                    if kind == PauseKind::Sacrifice {
                        self.credit.sacrifice();
                    }
                    decision.pauses.push(id);
                    active -= 1;
                }
            }
        }
        decision.admission_count = active as u32;
        decision
    }

    fn is_paused(&self, id: RequestId) -> bool {
        self.records.get(&id).is_some_and(|r| r.paused.is_some())
    }

    /// A departure: its record goes; a completion updates D and R0, and once X is formed g
    /// (`tpot_budget`) or the credit (`target_output_tps`).
    fn track(&mut self, departure: &Departure, target_formed: bool) {
        let record = self.records.remove(&departure.id).unwrap_or_default();
        let (true, Some(first_token)) = (departure.completed, departure.first_token_time) else {
            return;
        };
        let decode = (departure.finish_time - first_token).max(0.0);
        let paused = record.paused_through(departure.finish_time);
        let unpaused = (decode - paused).max(0.0);
        self.stats.completions += 1;
        self.stats.decode.push(unpaused);
        if departure.output_tokens >= 2 {
            let tpot = unpaused / (departure.output_tokens - 1) as f64;
            self.stats.tpot.push(tpot);
        }
        if !target_formed {
            return;
        }
        match self.params.mode {
            Mode::TpotBudget(_) => {
                let inflation = if unpaused > 0.0 {
                    paused / unpaused
                } else {
                    0.0
                };
                self.gain.step(inflation);
            }
            Mode::TargetOutputTps(t) => {
                let met = met_target(departure.output_tokens, decode, t);
                self.credit.complete(met, record.sacrificed);
            }
            Mode::Off => {}
        }
    }

    /// The resume phase: (resumes into free slots, forced resumes), each in lane order.
    /// Mode off: every paused resident resumes, forced, in id order. Otherwise the paused
    /// residents sorted in the mode's lane order take the free slots, and of the rest those
    /// paused for the maximum pause (or, target mode, a slack pause whose laxity fell to
    /// 0.01 D) resume regardless.
    pub fn resumes(&self, view: &StepView) -> (Vec<RequestId>, Vec<RequestId>) {
        let now = view.now;
        let paused: Vec<(&Resident, &Record)> = view
            .residents
            .iter()
            .filter_map(|r| {
                let record = self.records.get(&r.id)?;
                record.paused.is_some().then_some((r, record))
            })
            .collect();
        if !self.params.mode.is_on() {
            return (Vec::new(), paused.iter().map(|(r, _)| r.id).collect());
        }
        let active = view.residents.len() - paused.len();
        let free = (self.params.max_active as usize).saturating_sub(active);

        // The lane: least laxity first with sacrificed requests last (target mode), else
        // the oldest pause first; ties by id.
        let mut lane: Vec<((bool, f64), &Resident, &Record)> = paused
            .iter()
            .map(|&(r, record)| {
                let key = match self.params.mode {
                    Mode::TargetOutputTps(t) => (record.sacrificed, self.laxity(r, record, t, now)),
                    _ => (false, record.paused.map_or(0.0, |(since, _)| since)),
                };
                (key, r, record)
            })
            .collect();
        lane.sort_by(|a, b| {
            (a.0 .0.cmp(&b.0 .0))
                .then(a.0 .1.total_cmp(&b.0 .1))
                .then(a.1.id.cmp(&b.1.id))
        });

        let max_pause = match self.stats.d() {
            Some(d) => MAX_PAUSE_FRACTION_OF_D * d,
            None => MAX_PAUSE_BEFORE_D_S,
        };
        let slack_floor = SLACK_FORCED_RESUME_FRACTION_OF_D * self.stats.d().unwrap_or(0.0);
        let forced_due = |r: &Resident, record: &Record| {
            let Some((since, kind)) = record.paused else {
                return false;
            };
            let out_of_laxity = match (self.params.mode, kind) {
                (Mode::TargetOutputTps(t), PauseKind::Slack) => {
                    self.laxity(r, record, t, now) <= slack_floor
                }
                _ => false,
            };
            now - since >= max_pause || out_of_laxity
        };

        let taking_slots = free.min(lane.len());
        let resumes = lane[..taking_slots].iter().map(|(_, r, _)| r.id).collect();
        let forced = lane[taking_slots..]
            .iter()
            .filter(|(_, r, record)| forced_due(r, record))
            .map(|(_, r, _)| r.id)
            .collect();
        (resumes, forced)
    }

    /// The victim: among the eligible unpaused residents, `tpot_budget`'s by the victim rule;
    /// the target mode's from the first of its three tiers that has one.
    pub fn victim(&self, view: &StepView) -> Option<(RequestId, PauseKind)> {
        let now = view.now;
        let d = self.stats.d();
        let eligibility = Eligibility {
            now,
            min_decode_s: match d {
                Some(d) => MIN_DECODE_FRACTION_OF_D * d,
                None => MIN_DECODE_BEFORE_D_S,
            },
            fallback_tpot: self.stats.r0().map_or(0.0, |r0| 1.0 / r0),
        };
        // Eligible: not paused, first token out, decoding long enough, 64 iterations since
        // its last resume, not near finished.
        let mut candidates: Vec<(Candidate, Record)> = Vec::new();
        for r in view.residents {
            let record = self.records.get(&r.id).copied().unwrap_or_default();
            let Some(first_token) = r.first_token_time else {
                continue;
            };
            if record.paused.is_some() {
                continue;
            }
            let unpaused = (now - first_token - record.paused_through(now)).max(0.0);
            let iters = Record::iters_since_resume(Some(&record), r.decode_iters);
            if let Some(tpot) = eligibility.eligible_tpot(r, iters, unpaused) {
                let candidate = Candidate {
                    resident: r,
                    tpot: tpot.secs(),
                };
                candidates.push((candidate, record));
            }
        }
        let rule: VictimKey = self.params.victim_key;
        let limits = self.params.limits;
        let first_by_rule = |kind: PauseKind, keep: &dyn Fn(&Candidate, &Record) -> bool| {
            candidates
                .iter()
                .filter(|(c, record)| record.may_pause(kind, limits) && keep(c, record))
                .min_by(|a, b| rule.cmp(&a.0, &b.0))
                .map(|(c, _)| (c.resident.id, kind))
        };
        match self.params.mode {
            Mode::Off => None,
            // The victim rule's first, among those with pauses left.
            Mode::TpotBudget(_) => first_by_rule(PauseKind::Budget, &|_, _| true),
            Mode::TargetOutputTps(t) => {
                let lax = |c: &Candidate, record: &Record| self.laxity(c.resident, record, t, now);
                // Tier 1: laxity ≥ 0.02 D, not sacrificed, slack pauses left: the largest
                // laxity first, ties by id.
                let floor = SLACK_TIER_MIN_FRACTION_OF_D * d.unwrap_or(0.0);
                let slack = candidates
                    .iter()
                    .filter(|(_, record)| {
                        !record.sacrificed && record.may_pause(PauseKind::Slack, limits)
                    })
                    .map(|(c, record)| (lax(c, record), c.resident.id))
                    .filter(|&(l, _)| l >= floor)
                    .min_by(|&a, &b| largest_slack_first(a, b));
                if let Some((_, id)) = slack {
                    return Some((id, PauseKind::Slack));
                }
                // Tier 2: already below the target, or sacrificed earlier.
                let below =
                    |c: &Candidate, record: &Record| lax(c, record) < 0.0 || record.sacrificed;
                if let Some(victim) = first_by_rule(PauseKind::Below, &below) {
                    return Some(victim);
                }
                // Tier 3: a sacrifice, paid from the credit.
                if !self.credit.can_sacrifice() {
                    return None;
                }
                first_by_rule(PauseKind::Sacrifice, &|_, record| !record.sacrificed)
            }
        }
    }

    /// W: g × 0.15 D (`tpot_budget`), 0.15 D (`target_output_tps`).
    fn window(&self) -> f64 {
        let w0 = GUARD_FRACTION_OF_D * self.stats.d().unwrap_or(0.0);
        match self.params.mode {
            Mode::TpotBudget(_) => self.gain.g() * w0,
            _ => w0,
        }
    }

    /// Laxity at `now`: deadline − projected finish, with pauses taken out of the request's
    /// own rate (R0, or T before R0 exists, while it is too young to have one). Infinite
    /// before the first token.
    fn laxity(&self, r: &Resident, record: &Record, target: f64, now: f64) -> f64 {
        let Some(first_token) = r.first_token_time else {
            return f64::INFINITY;
        };
        let state = RateState {
            first_token_time: first_token,
            max_tokens: r.max_tokens,
            output_tokens: r.output_tokens,
            unpaused_decode_s: (now - first_token - record.paused_through(now)).max(0.0),
        };
        laxity(&state, now, target, self.stats.r0().unwrap_or(target))
    }
}

fn resident<'a>(view: &StepView<'a>, id: RequestId) -> Option<&'a Resident> {
    view.residents
        .binary_search_by_key(&id, |r| r.id)
        .ok()
        .map(|i| &view.residents[i])
}

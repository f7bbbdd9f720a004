//! The preemption controller, `GenPreemption` (SPEC §4.3). One `step` per pass, in three
//! short phases: `track` and `pause_one` here, `resumes` in `lane.rs` (the resume lane and
//! its speed-ups); the victim choice in `choose.rs` (`tpot_budget`) and `tiers.rs`
//! (`target_output_tps`). The rules they apply are each defined once: eligibility and the
//! victim rules (`victim.rs`), the per-request pause limits (`record.rs`), laxity and credit
//! (`objective.rs`), the at-risk rule (`risk.rs`), g (`controller.rs`). `reference.rs` is
//! the whole pass written plainly, and the fast paths are property-tested against it.
//! Without a mode the controller only tracks the running means D and R0, which the
//! admission queue needs too.

mod choose;
pub mod controller;
pub mod idmap;
pub mod kv_room;
mod lane;
pub mod objective;
mod record;
pub mod reference;
pub mod risk;
mod tiers;
pub mod victim;

use serde::Serialize;

use super::admission::{QueueFacts, GUARD_FRACTION_OF_D};
use super::stats::RunningMean;
use crate::ids::RequestId;
use controller::WindowGain;
use idmap::IdMap;
pub use kv_room::KvRoom;
use lane::{Paused, Resumes};
use objective::{met_target, Credit, RateState};
use record::Record;
pub use record::{
    PauseKind, PauseLimits, BELOW_PAUSES_PER_REQUEST, BUDGET_PAUSES_PER_REQUEST,
    SLACK_PAUSES_PER_REQUEST,
};
use victim::{Eligibility, VictimKey, MIN_DECODE_BEFORE_D_S, MIN_DECODE_FRACTION_OF_D};

/// Completions the running means D and R0 cover.
pub const STATS_WINDOW: usize = 500;
/// Paused cap as a fraction of `max_num_active_requests` (also each pool's headroom).
pub const PAUSED_CAP_FRACTION: f64 = 0.375;
/// Maximum pause, as a fraction of D, after which a paused request resumes regardless.
pub const MAX_PAUSE_FRACTION_OF_D: f64 = 0.35;
/// Maximum pause before the first completion.
pub const MAX_PAUSE_BEFORE_D_S: f64 = 10.0;
/// `target_output_tps`: the slack tier's thresholds in D. A request enters tier 1 with laxity
/// at or above the first; a slack-bounded pause ends when its laxity falls to the second.
pub const SLACK_TIER_MIN_FRACTION_OF_D: f64 = 0.02;
pub const SLACK_FORCED_RESUME_FRACTION_OF_D: f64 = 0.01;

/// ceil(0.375 × max_num_active_requests).
pub fn paused_cap(max_active: u32) -> u32 {
    (PAUSED_CAP_FRACTION * max_active as f64).ceil() as u32
}

/// The configured mode (`scheduler_config.gen_preemption`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Off,
    TpotBudget(f64),
    TargetOutputTps(f64),
}

impl Mode {
    pub fn is_on(&self) -> bool {
        !matches!(self, Mode::Off)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreemptParams {
    pub mode: Mode,
    pub max_active: u32,
    /// Victim order for `tpot_budget` and the sacrifice tier (ablations; default per SPEC).
    pub victim_key: VictimKey,
    /// Initial window gain g.
    pub g0: f64,
    /// Which completions step g (SPEC §4.3: any).
    pub gain_from: controller::GainFrom,
    /// The per-request pause limits (SPEC §4.3's; `tpot_budget`'s moves by an ablation).
    pub limits: PauseLimits,
}

impl PreemptParams {
    pub fn new(mode: Mode, max_active: u32) -> Self {
        Self {
            mode,
            max_active,
            victim_key: VictimKey::default(),
            g0: controller::G_START,
            gain_from: controller::GainFrom::Any,
            limits: PauseLimits::default(),
        }
    }
}

/// A resident request as the controller sees it (active or paused).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Resident {
    pub id: RequestId,
    pub arrival: f64,
    pub admit_time: f64,
    pub first_token_time: Option<f64>,
    pub output_tokens: u32,
    /// Decode iterations since the first token.
    pub decode_iters: u32,
    pub max_tokens: u32,
}

/// A request that left the resident set since the last pass.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Departure {
    pub id: RequestId,
    /// Finished normally (false: cancelled or failed).
    pub completed: bool,
    pub first_token_time: Option<f64>,
    pub finish_time: f64,
    pub output_tokens: u32,
}

/// What one pass gives the controller. `residents` is sorted by id.
#[derive(Debug, Clone, Copy)]
pub struct StepView<'a> {
    pub now: f64,
    pub residents: &'a [Resident],
    /// The same residents oldest admission first (ties by id), as places in `residents`,
    /// when the caller keeps that order: with the default victim key, `tpot_budget` then
    /// stops at the first eligible admission instead of scanning every resident. Places
    /// alone (not ids and times) keep the order four bytes a resident, for the worker's
    /// batch walk that reads it every pass; a place past the end names no resident.
    pub by_admission: Option<&'a [u32]>,
    pub departed: &'a [Departure],
    /// The admission queue, refreshed for `now`.
    pub queue: QueueFacts,
    /// The KV pool's promise: a pause needs the head to fit ([`KvRoom::fits_head`]).
    pub kv: KvRoom,
}

/// Admission order, the order of `StepView::by_admission` and of the batch: oldest admission
/// first, ties by id.
pub fn admission_order(a: &Resident, b: &Resident) -> std::cmp::Ordering {
    a.admit_time.total_cmp(&b.admit_time).then(a.id.cmp(&b.id))
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreemptDecision {
    pub pauses: Vec<RequestId>,
    pub resumes: Vec<RequestId>,
    pub forced_resumes: Vec<RequestId>,
    /// Active occupancy after this step (paused excluded). Above `max_active` after forced
    /// resumes, which blocks new admissions.
    pub admission_count: u32,
    /// The at-risk window W used this pass.
    pub window: f64,
}

/// D and R0: running means over the last 500 completions, pauses excluded.
#[derive(Debug, Clone)]
pub struct DecodeStats {
    decode: RunningMean,
    tpot: RunningMean,
    completions: u64,
}

impl Default for DecodeStats {
    fn default() -> Self {
        Self {
            decode: RunningMean::new(STATS_WINDOW),
            tpot: RunningMean::new(STATS_WINDOW),
            completions: 0,
        }
    }
}

impl DecodeStats {
    /// D: mean decode time (first token → finish) with pauses excluded.
    pub fn d(&self) -> Option<f64> {
        self.decode.mean()
    }
    /// R0: 1 / mean TPOT with pauses excluded.
    pub fn r0(&self) -> Option<f64> {
        self.tpot.mean().filter(|t| *t > 0.0).map(|t| 1.0 / t)
    }
    pub fn completions(&self) -> u64 {
        self.completions
    }
}

/// Counters since the last stat line (SPEC §4.7).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatWindow {
    pub pauses: u64,
    pub resumes: u64,
    pub forced_resumes: u64,
    pub completions: u64,
    pub inflation_sum: f64,
    pub below_target: u64,
}

/// One stat line's data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatLine {
    pub pauses: u64,
    pub resumes: u64,
    pub forced_resumes: u64,
    pub paused: usize,
    pub paused_cap: u32,
    pub g: Option<f64>,
    pub window_s: f64,
    pub d_s: Option<f64>,
    /// Mean TPOT inflation from pauses of the window's completions.
    pub tpot_inflation: f64,
    pub completions: u64,
    pub below_target: Option<u64>,
    pub credit: Option<f64>,
}

/// A paused request, for the debug endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PausedView {
    pub id: RequestId,
    pub kind: PauseKind,
    pub paused_for_s: f64,
    pub pauses: u32,
}

/// Totals since start, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Totals {
    pub pauses: u64,
    pub resumes: u64,
    pub forced_resumes: u64,
}

#[derive(Debug, Clone)]
pub struct GenPreemption {
    params: PreemptParams,
    cap: u32,
    stats: DecodeStats,
    gain: WindowGain,
    credit: Credit,
    records: IdMap<Record>,
    /// The paused ids: exactly the records whose `paused` is set (`pause`, `resume` and the
    /// departures change both together), each with a copy of that record.
    paused: IdMap<Paused>,
    window: StatWindow,
    totals: Totals,
    last_window: f64,
}

impl GenPreemption {
    pub fn new(params: PreemptParams) -> Self {
        let budget = match params.mode {
            Mode::TpotBudget(b) => b,
            _ => 0.0,
        };
        Self {
            params,
            cap: paused_cap(params.max_active),
            stats: DecodeStats::default(),
            gain: WindowGain::new(budget, params.g0).stepping_from(params.gain_from),
            credit: Credit::default(),
            records: IdMap::default(),
            paused: IdMap::default(),
            window: StatWindow::default(),
            totals: Totals::default(),
            last_window: 0.0,
        }
    }

    pub fn mode(&self) -> Mode {
        self.params.mode
    }
    pub fn paused_cap(&self) -> u32 {
        self.cap
    }
    pub fn stats(&self) -> &DecodeStats {
        &self.stats
    }
    pub fn d(&self) -> Option<f64> {
        self.stats.d()
    }
    pub fn g(&self) -> Option<f64> {
        matches!(self.params.mode, Mode::TpotBudget(_)).then(|| self.gain.g())
    }
    pub fn credit(&self) -> Option<f64> {
        matches!(self.params.mode, Mode::TargetOutputTps(_)).then(|| self.credit.value())
    }
    pub fn is_paused(&self, id: RequestId) -> bool {
        self.paused.contains(id)
    }
    pub fn paused_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.paused.ids()
    }
    pub fn paused_count(&self) -> usize {
        self.paused.len()
    }
    pub fn totals(&self) -> Totals {
        self.totals
    }
    /// Whether the request was ever sacrificed (target mode), for reporting.
    pub fn sacrificed(&self, id: RequestId) -> bool {
        self.records.get(id).is_some_and(|r| r.sacrificed)
    }
    /// Pauses so far for a resident request.
    pub fn pauses_of(&self, id: RequestId) -> u32 {
        self.records.get(id).map_or(0, |r| u32::from(r.pauses))
    }
    /// Seconds a resident request has spent paused, up to `now`.
    pub fn paused_seconds(&self, id: RequestId, now: f64) -> f64 {
        self.records.get(id).map_or(0.0, |r| r.paused_through(now))
    }

    /// Turn preemption off at run time (supervisor). Paused requests resume at the next step.
    pub fn disable(&mut self) {
        self.params.mode = Mode::Off;
    }

    /// The at-risk window W: g × 0.15 D (`tpot_budget`), 0.15 D (`target_output_tps`).
    pub fn window(&self) -> f64 {
        let w0 = GUARD_FRACTION_OF_D * self.stats.d().unwrap_or(0.0);
        match self.params.mode {
            Mode::TpotBudget(_) => self.gain.g() * w0,
            _ => w0,
        }
    }

    fn max_pause(&self) -> f64 {
        self.stats
            .d()
            .map_or(MAX_PAUSE_BEFORE_D_S, |d| MAX_PAUSE_FRACTION_OF_D * d)
    }

    fn eligibility(&self, now: f64) -> Eligibility {
        let d = self.stats.d();
        Eligibility {
            now,
            min_decode_s: d.map_or(MIN_DECODE_BEFORE_D_S, |d| MIN_DECODE_FRACTION_OF_D * d),
            fallback_tpot: self.stats.r0().map_or(0.0, |r| 1.0 / r),
        }
    }

    /// What a resident's laxity depends on at `now`; `None` before its first token.
    fn rate_state(r: &Resident, record: Option<&Record>, now: f64) -> Option<RateState> {
        let ft = r.first_token_time?;
        let paused = record.map_or(0.0, |rec| rec.paused_through(now));
        Some(RateState {
            first_token_time: ft,
            max_tokens: r.max_tokens,
            output_tokens: r.output_tokens,
            unpaused_decode_s: (now - ft - paused).max(0.0),
        })
    }

    /// One pass (SPEC §4.3): track → resume → pause. The queue must be refreshed for
    /// `view.now`. `reference::ReferencePreemption::step` is the same pass written plainly;
    /// the property tests require both to decide alike.
    pub fn step(&mut self, view: &StepView) -> PreemptDecision {
        self.check_view(view);
        self.track(view.departed, view.queue.target_formed);
        let resumes = self.resumes(view);
        let mut active = self.apply_resumes(view, &resumes);
        let mut decision = PreemptDecision {
            resumes: resumes.normal,
            forced_resumes: resumes.forced,
            ..PreemptDecision::default()
        };
        if self.params.mode.is_on() {
            let w = self.window();
            self.last_window = w;
            decision.window = w;
            if let Some(id) = self.pause_one(view, active, w) {
                decision.pauses.push(id);
                active -= 1;
            }
        }
        self.count(&decision);
        decision.admission_count = active;
        decision
    }

    /// Track: account every request that left since the last pass.
    fn track(&mut self, departed: &[Departure], target_formed: bool) {
        for departure in departed {
            let record = self.records.remove(departure.id).unwrap_or_default();
            self.paused.remove(departure.id);
            if departure.completed {
                self.complete(departure, &record, target_formed);
            }
        }
    }

    /// A completion: D, R0 and the stat window always; g or the credit once X is formed.
    fn complete(&mut self, departure: &Departure, record: &Record, target_formed: bool) {
        let Some(ft) = departure.first_token_time else {
            return;
        };
        let paused = record.paused_through(departure.finish_time);
        let decode = (departure.finish_time - ft).max(0.0);
        let unpaused = (decode - paused).max(0.0);
        self.stats.completions += 1;
        self.stats.decode.push(unpaused);
        if departure.output_tokens >= 2 {
            self.stats
                .tpot
                .push(unpaused / (departure.output_tokens - 1) as f64);
        }
        let inflation = if unpaused > 0.0 {
            paused / unpaused
        } else {
            0.0
        };
        self.window.completions += 1;
        self.window.inflation_sum += inflation;
        if !target_formed {
            return;
        }
        match self.params.mode {
            Mode::TpotBudget(_) => self.gain.step(inflation),
            Mode::TargetOutputTps(t) => {
                let met = met_target(departure.output_tokens, decode, t);
                if !met {
                    self.window.below_target += 1;
                }
                self.credit.complete(met, record.sacrificed);
            }
            Mode::Off => {}
        }
    }

    /// Applies the resume phase: forgets the paused requests that are gone, ends the pauses
    /// of those resuming. Returns the active occupancy after the resumes.
    fn apply_resumes(&mut self, view: &StepView, resumes: &Resumes) -> u32 {
        for &id in &resumes.gone {
            self.paused.remove(id);
            self.records.remove(id);
        }
        let mut active = resumes.active;
        for &id in resumes.normal.iter().chain(&resumes.forced) {
            let place = view.residents.partition_point(|r| r.id < id);
            let iters = view.residents[place].decode_iters;
            self.paused.remove(id);
            if let Some(record) = self.records.get_mut(id) {
                record.end_pause(iters, view.now);
            }
            active += 1;
        }
        active
    }

    /// Pause: at most one per pass, only when no slot is free, the paused cap has room, the
    /// head is at risk for the window `w` and the KV pool can let every resident and the head
    /// finish (`kv_room`); the victim frees the slot the head needs.
    fn pause_one(&mut self, view: &StepView, active: u32, w: f64) -> Option<RequestId> {
        let needed = view.queue.target_formed
            && active == self.params.max_active
            && (self.paused.len() as u32) < self.cap
            && risk::head_at_risk(self.params.mode, view.queue.head_slack, w)
            && view.kv.fits_head();
        if !needed {
            return None;
        }
        let (id, kind) = self.choose_victim(view)?;
        let record = self.records.get_or_insert_with(id, Record::default);
        record.start_pause(kind, view.now);
        let record = *record;
        if kind == PauseKind::Sacrifice {
            self.credit.sacrifice();
        }
        self.paused
            .get_or_insert_with(id, || Paused::new(record))
            .record = record;
        Some(id)
    }

    /// The view's promises (debug builds), and the controller's own: the paused entries are
    /// the open pauses of the records, each with a copy of its record.
    fn check_view(&self, view: &StepView) {
        debug_assert!(
            view.residents.windows(2).all(|w| w[0].id < w[1].id),
            "residents sorted by id"
        );
        debug_assert!(
            view.by_admission.is_none_or(|o| {
                let at = |p: &u32| view.residents.get(*p as usize);
                o.len() == view.residents.len()
                    && o.windows(2).all(|w| match (at(&w[0]), at(&w[1])) {
                        (Some(a), Some(b)) => admission_order(a, b).is_lt(),
                        _ => false,
                    })
            }),
            "by_admission: every resident's place, oldest admission first"
        );
        // The victim walks read "paused" from the records alone, the paused walk from the
        // entries' copies.
        debug_assert!(
            self.paused.iter().map(|(id, p)| (id, p.record)).eq(self
                .records
                .iter()
                .filter(|(_, r)| r.paused.is_some())
                .map(|(id, r)| (id, *r))),
            "paused ids are the records whose pause is open, with those records"
        );
    }

    fn count(&mut self, decision: &PreemptDecision) {
        let (p, r, f) = (
            decision.pauses.len() as u64,
            decision.resumes.len() as u64,
            decision.forced_resumes.len() as u64,
        );
        self.window.pauses += p;
        self.window.resumes += r;
        self.window.forced_resumes += f;
        self.totals.pauses += p;
        self.totals.resumes += r;
        self.totals.forced_resumes += f;
    }

    /// The stat line's data since the last call; resets the window counters.
    pub fn take_stat_line(&mut self) -> StatLine {
        let w = std::mem::take(&mut self.window);
        let target = matches!(self.params.mode, Mode::TargetOutputTps(_));
        StatLine {
            pauses: w.pauses,
            resumes: w.resumes,
            forced_resumes: w.forced_resumes,
            paused: self.paused.len(),
            paused_cap: self.cap,
            g: self.g(),
            window_s: self.last_window,
            d_s: self.stats.d(),
            tpot_inflation: if w.completions > 0 {
                w.inflation_sum / w.completions as f64
            } else {
                0.0
            },
            completions: w.completions,
            below_target: target.then_some(w.below_target),
            credit: self.credit(),
        }
    }

    /// Paused requests with their counts and ages, for the debug endpoint.
    pub fn paused_view(&self, now: f64) -> Vec<PausedView> {
        self.paused
            .ids()
            .filter_map(|id| {
                let rec = self.records.get(id)?;
                let (since, kind) = rec.paused?;
                Some(PausedView {
                    id,
                    kind,
                    paused_for_s: now - since,
                    pauses: u32::from(rec.pauses),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

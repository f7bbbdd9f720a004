//! The preemption controller, `GenPreemption` (SPEC §4.3). One `step` per pass:
//! track → resume → pause. Two modes, `tpot_budget` and `target_output_tps`, are two victim
//! strategies over the same pause/resume bookkeeping. Without a mode it only tracks the
//! running means D and R0, which the admission queue needs too.

mod choose;
pub mod controller;
pub mod idmap;
mod lane;
pub mod objective;
pub mod risk;
mod tiers;
pub mod victim;

use serde::Serialize;

use super::admission::{QueueFacts, GUARD_FRACTION_OF_D};
use super::stats::RunningMean;
use super::RequestId;
use controller::WindowGain;
use idmap::IdMap;
use lane::each_paused_row;
use objective::{met_target, Credit, RateState};
use victim::{Eligibility, VictimKey, MIN_DECODE_BEFORE_D_S, MIN_DECODE_FRACTION_OF_D};

/// Completions the running means D and R0 cover.
pub const STATS_WINDOW: usize = 500;
/// Paused cap as a fraction of `max_num_active_requests` (also each pool's headroom).
pub const PAUSED_CAP_FRACTION: f64 = 0.375;
/// Maximum pause, as a fraction of D, after which a paused request resumes regardless.
pub const MAX_PAUSE_FRACTION_OF_D: f64 = 0.35;
/// Maximum pause before the first completion.
pub const MAX_PAUSE_BEFORE_D_S: f64 = 10.0;
/// `tpot_budget`: pauses per request.
pub const BUDGET_PAUSES_PER_REQUEST: u32 = 2;
/// `target_output_tps`: slack-bounded pauses per request, and their thresholds in D.
pub const SLACK_PAUSES_PER_REQUEST: u32 = 8;
pub const SLACK_TIER_MIN_FRACTION_OF_D: f64 = 0.02;
pub const SLACK_FORCED_RESUME_FRACTION_OF_D: f64 = 0.01;
/// `target_output_tps`: pauses per request below the target (or sacrificed).
pub const BELOW_PAUSES_PER_REQUEST: u32 = 3;

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
}

impl PreemptParams {
    pub fn new(mode: Mode, max_active: u32) -> Self {
        Self {
            mode,
            max_active,
            victim_key: VictimKey::default(),
            g0: 1.0,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseKind {
    /// `tpot_budget` pause.
    Budget,
    /// Target mode, tier 1: paid from the request's own laxity.
    Slack,
    /// Target mode, tier 2: already below the target.
    Below,
    /// Target mode, tier 3: sacrificed on credit.
    Sacrifice,
}

/// A request's pause history. Its counts are bytes: the per-request limits keep each below
/// a dozen, and at 32 bytes a record (and the paused entry's copy of it) takes two-thirds
/// of the room it did with four-byte counts, in maps the controller walks every pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Record {
    pauses: u8,
    slack_pauses: u8,
    below_pauses: u8,
    sacrificed: bool,
    paused_total: f64,
    iters_at_resume: u32,
    paused: Option<(f64, PauseKind)>,
}

/// A paused request's place in the resume lane: (sacrificed, laxity) in target mode,
/// (false, paused since) otherwise; ties by id.
type LaneKey = (bool, f64);

fn lane_order(a: &(LaneKey, PausedRow), b: &(LaneKey, PausedRow)) -> std::cmp::Ordering {
    a.0 .0
        .cmp(&b.0 .0)
        .then(a.0 .1.total_cmp(&b.0 .1))
        .then(a.1.id.cmp(&b.1.id))
}

/// A paused resident as one pass sees it. Row and record are borrowed, not copied: the
/// lane is built every pass, and a copied record made every paused row pay for its size.
#[derive(Debug, Clone, Copy)]
struct PausedRow<'a> {
    id: RequestId,
    resident: &'a Resident,
    record: &'a Record,
}

/// A paused request: where its row was found last pass, and its record as the pause left
/// it. A record changes only when a pause starts or ends (or its request leaves, which ends
/// the entry too), so the copy is the record for the whole pause, and the paused walk that
/// every pass makes reads it here instead of merging the records for it.
#[derive(Debug, Clone)]
struct Paused {
    /// Its row's place in the last pass's residents, where it is looked for first (a hint,
    /// updated by the walk that reads the entries).
    place: std::cell::Cell<u32>,
    record: Record,
}

impl Paused {
    fn new(record: Record) -> Self {
        Self {
            place: std::cell::Cell::new(0),
            record,
        }
    }
}

/// The direction a merge walks its id-ordered sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    Ascending,
    Descending,
}

/// Advance an id-ordered iterator to `id` and return its item there, if any. Called with
/// ids in the iterator's own direction, a run over two id-ordered sequences is one merge.
#[inline(always)]
fn merge_find<I, T>(
    walk: Walk,
    it: &mut std::iter::Peekable<I>,
    id: RequestId,
    key: impl Fn(&T) -> RequestId,
) -> Option<T>
where
    I: Iterator<Item = T>,
{
    let before = match walk {
        Walk::Ascending => std::cmp::Ordering::Less,
        Walk::Descending => std::cmp::Ordering::Greater,
    };
    while it.peek().is_some_and(|x| key(x).cmp(&id) == before) {
        it.next();
    }
    it.next_if(|x| key(x) == id)
}

impl Record {
    fn paused_through(&self, now: f64) -> f64 {
        self.paused_total + self.paused.map_or(0.0, |(since, _)| (now - since).max(0.0))
    }
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
            gain: WindowGain::new(budget, params.g0),
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

    fn rate_state(r: &Resident, rec: Option<&Record>, now: f64) -> Option<RateState> {
        let ft = r.first_token_time?;
        let paused = rec.map_or(0.0, |rec| rec.paused_through(now));
        Some(RateState {
            first_token_time: ft,
            max_tokens: r.max_tokens,
            output_tokens: r.output_tokens,
            unpaused_decode_s: (now - ft - paused).max(0.0),
        })
    }

    /// Track: account every request that left since the last pass.
    fn track(&mut self, departed: &[Departure], target_formed: bool) {
        for dep in departed {
            let rec = self.records.remove(dep.id).unwrap_or_default();
            self.paused.remove(dep.id);
            if !dep.completed {
                continue;
            }
            let Some(ft) = dep.first_token_time else {
                continue;
            };
            let paused = rec.paused_through(dep.finish_time);
            let decode = (dep.finish_time - ft).max(0.0);
            let unpaused = (decode - paused).max(0.0);
            self.stats.completions += 1;
            self.stats.decode.push(unpaused);
            if dep.output_tokens >= 2 {
                self.stats
                    .tpot
                    .push(unpaused / (dep.output_tokens - 1) as f64);
            }
            let inflation = if unpaused > 0.0 {
                paused / unpaused
            } else {
                0.0
            };
            self.window.completions += 1;
            self.window.inflation_sum += inflation;
            if !target_formed {
                continue;
            }
            match self.params.mode {
                Mode::TpotBudget(_) => self.gain.step(inflation),
                Mode::TargetOutputTps(t) => {
                    let met = met_target(dep.output_tokens, decode, t);
                    if !met {
                        self.window.below_target += 1;
                    }
                    self.credit.complete(met, rec.sacrificed);
                }
                Mode::Off => {}
            }
        }
    }

    /// Ends a pause; `iters` is the resident's decode iterations now.
    fn resume(&mut self, id: RequestId, iters: u32, now: f64) {
        self.paused.remove(id);
        if let Some(rec) = self.records.get_mut(id) {
            if let Some((since, _)) = rec.paused.take() {
                rec.paused_total += (now - since).max(0.0);
            }
            rec.iters_at_resume = iters;
        }
    }

    fn pause(&mut self, id: RequestId, kind: PauseKind, now: f64) {
        let rec = self.records.get_or_insert_with(id, Record::default);
        // Saturating: the limits stop each count long before a byte would wrap.
        rec.pauses = rec.pauses.saturating_add(1);
        match kind {
            PauseKind::Slack => rec.slack_pauses = rec.slack_pauses.saturating_add(1),
            PauseKind::Below => rec.below_pauses = rec.below_pauses.saturating_add(1),
            PauseKind::Sacrifice => {
                rec.below_pauses = rec.below_pauses.saturating_add(1);
                rec.sacrificed = true;
                self.credit.sacrifice();
            }
            PauseKind::Budget => {}
        }
        rec.paused = Some((now, kind));
        let record = *rec;
        self.paused
            .get_or_insert_with(id, || Paused::new(record))
            .record = record;
    }

    /// One pass: track → resume → pause. The queue must be refreshed for `v.now`.
    pub fn step(&mut self, v: &StepView) -> PreemptDecision {
        debug_assert!(
            v.residents.windows(2).all(|w| w[0].id < w[1].id),
            "residents sorted by id"
        );
        debug_assert!(
            v.by_admission.is_none_or(|o| {
                let at = |p: &u32| v.residents.get(*p as usize);
                o.len() == v.residents.len()
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
        let formed = v.queue.target_formed;
        self.track(v.departed, formed);
        let mut dec = PreemptDecision::default();
        // A paused id that is no longer resident (left without a departure record) is
        // dropped. The lane borrows the paused entries, so the pass decides its resumes first
        // and applies them, and drops the gone, once the lane is done with.
        let mut gone = Vec::new();
        let max_active = self.params.max_active as usize;
        let on = self.params.mode.is_on();
        // A paused id that left only adds to the active count, so when the residents leave
        // no free slot without it, none is free: the pass can only force resumes, and each
        // paused row is tested as it is found, so the lane holds only the forced ones.
        let only_forced = on && v.residents.len().saturating_sub(self.paused.len()) >= max_active;
        let rule = self.lane_rule(v.now);
        let mut lane = Vec::with_capacity(if only_forced { 0 } else { self.paused.len() });
        each_paused_row(&self.paused, v.residents, &mut gone, |row| {
            if !only_forced || rule.forced_due(&row, None) {
                // Keys are left unset until needed.
                lane.push(((false, 0.0), row));
            }
        });
        // Every paused id but the gone is resident, so occupancy needs no scan.
        let active = (v.residents.len() + gone.len()).saturating_sub(self.paused.len());
        if !on {
            // Off (or disabled at run time): nothing stays paused.
            dec.forced_resumes
                .extend(lane.iter().map(|(_, row)| row.id));
        } else {
            // Resume: paused requests take free slots ahead of any admission, in lane order;
            // past the maximum pause (or, in target mode, out of laxity) they resume
            // regardless. Every key and rule reads the records as they were before this
            // pass's resumes.
            // Only the order of the rows that take free slots and of the forced resumes
            // shows, so only those are sorted (the key is a total order: any sort gives one
            // result), and with no free slot only the forced resumes need their keys.
            let free = match only_forced {
                true => 0,
                false => max_active.saturating_sub(active).min(lane.len()),
            };
            if free > 0 {
                self.with_lane_keys(&mut lane, v.now);
            }
            if free > 0 && free < lane.len() {
                lane.select_nth_unstable_by(free - 1, lane_order);
            }
            let (first, rest) = lane.split_at_mut(free);
            first.sort_unstable_by(lane_order);
            dec.resumes.extend(first.iter().map(|(_, row)| row.id));
            let mut forced: Vec<_> = rest
                .iter()
                .filter(|(key, row)| {
                    only_forced || rule.forced_due(row, (free > 0).then_some(key.1))
                })
                .copied()
                .collect();
            if free == 0 {
                self.with_lane_keys(&mut forced, v.now);
            }
            forced.sort_unstable_by(lane_order);
            dec.forced_resumes
                .extend(forced.iter().map(|(_, row)| row.id));
        }
        let mut active = active as u32;
        for id in gone {
            self.paused.remove(id);
            self.records.remove(id);
        }
        for &id in dec.resumes.iter().chain(&dec.forced_resumes) {
            let i = v.residents.partition_point(|r| r.id < id);
            self.resume(id, v.residents[i].decode_iters, v.now);
            active += 1;
        }
        if !self.params.mode.is_on() {
            self.count(&dec);
            dec.admission_count = active;
            return dec;
        }

        // Pause: one per pass, only when the pause frees the slot the at-risk head needs.
        let w = self.window();
        self.last_window = w;
        dec.window = w;
        if formed
            && active == self.params.max_active
            && (self.paused.len() as u32) < self.cap
            && risk::head_at_risk(self.params.mode, v.queue.head_slack, w)
        {
            if let Some((id, kind)) = self.choose_victim(v) {
                self.pause(id, kind, v.now);
                dec.pauses.push(id);
                active -= 1;
            }
        }
        self.count(&dec);
        dec.admission_count = active;
        dec
    }
    fn count(&mut self, dec: &PreemptDecision) {
        let (p, r, f) = (
            dec.pauses.len() as u64,
            dec.resumes.len() as u64,
            dec.forced_resumes.len() as u64,
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

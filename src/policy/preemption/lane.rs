//! The resume lane (SPEC §4.3, "Resume"): paused requests joined with their rows and
//! records, their keys in the mode's resume order, when a pause must end regardless of free
//! slots, and the resume phase itself (`GenPreemption::resumes`, the one function that holds
//! its speed-ups).

use std::cell::Cell;

use super::idmap::IdMap;
use super::objective::{deadline_slack_estimate, laxity, laxity_estimate, own_tpot};
use super::record::Record;
use super::{
    GenPreemption, Mode, PauseKind, Resident, StepView, SLACK_FORCED_RESUME_FRACTION_OF_D,
};
use crate::ids::RequestId;

/// A paused request: where its row was found last pass, and its record as the pause left
/// it. A record changes only when a pause starts or ends (or its request leaves, which ends
/// the entry too), so the copy is the record for the whole pause, and the paused walk that
/// every pass makes reads it here instead of merging the records for it.
#[derive(Debug, Clone)]
pub(super) struct Paused {
    /// Its row's place in the last pass's residents, where it is looked for first (a hint,
    /// updated by the walk that reads the entries).
    place: Cell<u32>,
    pub record: Record,
}

impl Paused {
    pub fn new(record: Record) -> Self {
        Self {
            place: Cell::new(0),
            record,
        }
    }
}

/// A paused resident as one pass sees it. Row and record are borrowed, not copied: the
/// lane is built every pass, and a copied record made every paused row pay for its size.
#[derive(Debug, Clone, Copy)]
pub(super) struct PausedRow<'a> {
    id: RequestId,
    resident: &'a Resident,
    record: &'a Record,
}

/// A paused request's place in the resume lane: (sacrificed, laxity) in target mode,
/// (false, paused since) otherwise; ties by id (`lane_order`).
type LaneKey = (bool, f64);

/// A lane entry: its key (set only when read) and its row.
type LaneEntry<'a> = (LaneKey, PausedRow<'a>);

/// The resume order: sacrificed last, then the key's time, then the id.
fn lane_order(a: &LaneEntry, b: &LaneEntry) -> std::cmp::Ordering {
    let ((a_sacrificed, a_key), (b_sacrificed, b_key)) = (a.0, b.0);
    a_sacrificed
        .cmp(&b_sacrificed)
        .then(a_key.total_cmp(&b_key))
        .then(a.1.id.cmp(&b.1.id))
}

/// The resume phase's decisions.
#[derive(Debug, Default)]
pub(super) struct Resumes {
    /// Resumes into free slots, in lane order.
    pub normal: Vec<RequestId>,
    /// Resumes regardless of free slots (or all, with the mode off), in lane order.
    pub forced: Vec<RequestId>,
    /// Paused ids no longer resident that left without a departure record.
    pub gone: Vec<RequestId>,
    /// Active occupancy before these resumes: the residents that are not paused.
    pub active: u32,
}

impl GenPreemption {
    /// The resume phase. It equals the reference's (`ReferencePreemption::resumes`):
    /// - mode off (or disabled): every paused resident resumes, forced, in id order;
    /// - otherwise the paused residents in lane order (`LaneRule::key`, ties by id) take the
    ///   free slots (`max_active` − active) first to last, and of the rest those
    ///   `LaneRule::forced_due` resume regardless, in lane order.
    ///
    /// Every key and rule reads the records as they were before this pass's resumes. The
    /// speed-ups, each giving that same result:
    /// - when the residents leave no slot free even counting a gone paused id as active (it
    ///   only adds to the count), no slot is free: only forced-due rows enter the lane
    ///   (`only_forced`), tested as they are found;
    /// - keys are computed only where read (placeholders otherwise): for every row when slots
    ///   are free, else for the forced rows alone;
    /// - only the rows that take free slots are sorted after `select_nth_unstable_by` splits
    ///   them off (the key is a total order, so any sort gives one result), and the forced
    ///   test of the others reuses the laxity in their key;
    /// - paused rows are found from last pass's places (`each_paused_row`), and a forced test
    ///   without a key decides on a laxity estimate when it can (`laxity_at_most`).
    pub(super) fn resumes(&self, view: &StepView) -> Resumes {
        let mut out = Resumes::default();
        let max_active = self.params.max_active as usize;
        let on = self.params.mode.is_on();
        let only_forced =
            on && view.residents.len().saturating_sub(self.paused.len()) >= max_active;
        let rule = self.lane_rule(view.now);
        let mut lane = Vec::with_capacity(if only_forced { 0 } else { self.paused.len() });
        each_paused_row(&self.paused, view.residents, &mut out.gone, |row| {
            if !only_forced || rule.forced_due(&row, None) {
                lane.push(((false, 0.0), row));
            }
        });
        // Every paused id but the gone is resident, so occupancy needs no scan.
        let active = (view.residents.len() + out.gone.len()).saturating_sub(self.paused.len());
        out.active = active as u32;
        if !on {
            out.forced.extend(lane.iter().map(|(_, row)| row.id));
            return out;
        }
        let free = match only_forced {
            true => 0,
            false => max_active.saturating_sub(active).min(lane.len()),
        };
        if free > 0 {
            for (key, row) in lane.iter_mut() {
                *key = rule.key(row);
            }
        }
        if free > 0 && free < lane.len() {
            lane.select_nth_unstable_by(free - 1, lane_order);
        }
        let (first, rest) = lane.split_at_mut(free);
        first.sort_unstable_by(lane_order);
        out.normal.extend(first.iter().map(|(_, row)| row.id));
        let mut forced: Vec<_> = rest
            .iter()
            .filter(|(key, row)| only_forced || rule.forced_due(row, (free > 0).then_some(key.1)))
            .copied()
            .collect();
        if free == 0 {
            for (key, row) in forced.iter_mut() {
                *key = rule.key(row);
            }
        }
        forced.sort_unstable_by(lane_order);
        out.forced.extend(forced.iter().map(|(_, row)| row.id));
        out
    }

    /// This pass's lane rule: the controller's running means read once, not once per
    /// paused request.
    fn lane_rule(&self, now: f64) -> LaneRule {
        let target = match self.params.mode {
            Mode::TargetOutputTps(t) => Some(t),
            _ => None,
        };
        LaneRule {
            now,
            max_pause: self.max_pause(),
            target,
            inverse_target: target.map_or(0.0, |t| 1.0 / t),
            fallback_rate: target.map_or(0.0, |t| self.stats.r0().unwrap_or(t)),
            slack_floor: SLACK_FORCED_RESUME_FRACTION_OF_D * self.stats.d().unwrap_or(0.0),
        }
    }
}

/// Every paused request that is still resident, with its row and record, handed to `each`;
/// the ids of the others go to `gone`. Each paused id keeps its row's place in the last
/// pass's residents: rows move only when others leave before them (a few places down) or
/// join before them (rarely: ids mostly grow), so the row is looked for there and a few
/// places below before a search. The record is the entry's own copy.
fn each_paused_row<'a>(
    paused: &'a IdMap<Paused>,
    residents: &'a [Resident],
    gone: &mut Vec<RequestId>,
    mut each: impl FnMut(PausedRow<'a>),
) {
    for (id, entry) in paused.iter() {
        let place = entry.place.get();
        let near = (place.saturating_sub(PLACES_LOOKED_BELOW)..=place)
            .rev()
            .find(|&p| residents.get(p as usize).is_some_and(|r| r.id == id));
        let found = near.or_else(|| {
            residents
                .binary_search_by_key(&id, |r| r.id)
                .ok()
                .map(|p| p as u32)
        });
        let Some(at) = found else {
            gone.push(id);
            continue;
        };
        entry.place.set(at);
        each(PausedRow {
            id,
            resident: &residents[at as usize],
            record: &entry.record,
        });
    }
}

/// How far below its last place a paused request's row is looked for before a search: a
/// pass with more departures before it than this searches.
const PLACES_LOOKED_BELOW: u32 = 3;

/// The resume order and the forced-resume rule for one pass (SPEC §4.3, "Resume").
struct LaneRule {
    now: f64,
    max_pause: f64,
    /// T in target mode.
    target: Option<f64>,
    /// 1 / T (0 outside target mode), for laxity estimates.
    inverse_target: f64,
    /// R0, or T before R0 exists: the rate of a request too young to have its own.
    fallback_rate: f64,
    /// 0.01 D: a slack-bounded pause ends when the laxity falls to it.
    slack_floor: f64,
}

impl LaneRule {
    fn laxity(&self, r: &Resident, record: &Record, target: f64) -> f64 {
        GenPreemption::rate_state(r, Some(record), self.now).map_or(f64::INFINITY, |state| {
            laxity(&state, self.now, target, self.fallback_rate)
        })
    }

    /// Whether the laxity is at or below `floor`, computing it only when its estimate
    /// (`laxity_estimate`) cannot tell.
    fn laxity_at_most(&self, r: &Resident, record: &Record, target: f64, floor: f64) -> bool {
        let Some(state) = GenPreemption::rate_state(r, Some(record), self.now) else {
            return false;
        };
        if let Some(tpot) = own_tpot(state.output_tokens, state.unpaused_decode_s) {
            let slack = deadline_slack_estimate(
                state.first_token_time,
                state.max_tokens,
                self.inverse_target,
                self.now,
            );
            let remaining = state.max_tokens.saturating_sub(state.output_tokens);
            if laxity_estimate(slack, remaining, tpot).above(floor) {
                return false;
            }
        }
        laxity(&state, self.now, target, self.fallback_rate) <= floor
    }

    /// A paused request's key in the mode's resume order (see `lane_order`): least laxity
    /// first with sacrificed requests last (target mode), else the oldest pause first.
    fn key(&self, row: &PausedRow) -> LaneKey {
        match self.target {
            // Least slack first; sacrificed requests after every other paused request.
            Some(t) => {
                let sacrificed = row.record.sacrificed;
                let lax = self.laxity(row.resident, row.record, t);
                (sacrificed, lax)
            }
            // Oldest pause first.
            None => (false, row.record.paused.map_or(0.0, |p| p.0)),
        }
    }

    /// Whether the pause ends regardless of free slots: paused for the maximum pause, or
    /// (target mode) a slack-bounded pause whose laxity fell to 0.01 D. `keyed_laxity`: the
    /// row's lane key laxity when its key is set, which in target mode is the very laxity
    /// this rule reads.
    fn forced_due(&self, row: &PausedRow, keyed_laxity: Option<f64>) -> bool {
        let Some((since, kind)) = row.record.paused else {
            return false;
        };
        if self.now - since >= self.max_pause {
            return true;
        }
        match (self.target, kind) {
            (Some(t), PauseKind::Slack) => match keyed_laxity {
                Some(lax) => lax <= self.slack_floor,
                None => self.laxity_at_most(row.resident, row.record, t, self.slack_floor),
            },
            _ => false,
        }
    }
}

//! The resume lane: paused requests joined with their rows and records, their keys in the
//! mode's resume order, and when a pause must end regardless of free slots (SPEC §4.3,
//! "Resume").

use super::idmap::IdMap;
use super::objective::{deadline_slack_estimate, laxity, laxity_estimate, own_tpot};
use super::{
    GenPreemption, LaneKey, Mode, PauseKind, Paused, PausedRow, Record, Resident,
    SLACK_FORCED_RESUME_FRACTION_OF_D,
};
use crate::policy::RequestId;

/// Every paused request that is still resident, with its row and record, handed to `each`;
/// the ids of the others go to `gone`. Each paused id keeps its row's place in the last
/// pass's residents: rows move only when others leave before them (a few places down) or
/// join before them (rarely: ids mostly grow), so the row is looked for there and a few
/// places below before a search. The record is the entry's own copy.
pub(super) fn each_paused_row<'a>(
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

impl GenPreemption {
    /// Sets the resume-lane key of each row. A key reads only its own row's copy of the
    /// record, so it is the same before or after other rows resume.
    pub(super) fn with_lane_keys(&self, rows: &mut [(LaneKey, PausedRow)], now: f64) {
        let rule = self.lane_rule(now);
        for (key, row) in rows.iter_mut() {
            *key = rule.key(row);
        }
    }

    /// This pass's lane rule: the controller's running means read once, not once per
    /// paused request.
    pub(super) fn lane_rule(&self, now: f64) -> LaneRule {
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

/// The resume order and the forced-resume rule for one pass (SPEC §4.3, "Resume").
pub(super) struct LaneRule {
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
    fn laxity(&self, r: &Resident, rec: Option<&Record>, target: f64) -> f64 {
        GenPreemption::rate_state(r, rec, self.now).map_or(f64::INFINITY, |s| {
            laxity(&s, self.now, target, self.fallback_rate)
        })
    }

    /// Whether the laxity is at or below `floor`, computing it only when its estimate
    /// (`laxity_estimate`) cannot tell.
    fn laxity_at_most(&self, r: &Resident, rec: Option<&Record>, target: f64, floor: f64) -> bool {
        let Some(s) = GenPreemption::rate_state(r, rec, self.now) else {
            return false;
        };
        if let Some(tpot) = own_tpot(s.output_tokens, s.unpaused_decode_s) {
            let slack = deadline_slack_estimate(
                s.first_token_time,
                s.max_tokens,
                self.inverse_target,
                self.now,
            );
            let remaining = s.max_tokens.saturating_sub(s.output_tokens);
            if laxity_estimate(slack, remaining, tpot).above(floor) {
                return false;
            }
        }
        laxity(&s, self.now, target, self.fallback_rate) <= floor
    }

    /// A paused request's key in the mode's resume order (see `lane_order`).
    fn key(&self, row: &PausedRow) -> LaneKey {
        match self.target {
            // Least slack first; sacrificed requests after every other paused request.
            Some(t) => {
                let sacrificed = row.record.sacrificed;
                let lax = self.laxity(row.resident, Some(row.record), t);
                (sacrificed, lax)
            }
            // Oldest pause first.
            None => (false, row.record.paused.map_or(0.0, |p| p.0)),
        }
    }

    /// `keyed_laxity`: the row's lane key laxity when its key is set, which in target mode
    /// is the very laxity this rule reads.
    pub(super) fn forced_due(&self, row: &PausedRow, keyed_laxity: Option<f64>) -> bool {
        let rec = row.record;
        let Some((since, kind)) = rec.paused else {
            return false;
        };
        if self.now - since >= self.max_pause {
            return true;
        }
        match (self.target, kind) {
            (Some(t), PauseKind::Slack) => match keyed_laxity {
                Some(lax) => lax <= self.slack_floor,
                None => self.laxity_at_most(row.resident, Some(rec), t, self.slack_floor),
            },
            _ => false,
        }
    }
}

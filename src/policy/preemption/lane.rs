//! The resume lane: paused requests joined with their rows and records, their keys in the
//! mode's resume order, and when a pause must end regardless of free slots (SPEC §4.3,
//! "Resume").

use super::{
    merge_find, GenPreemption, LaneKey, Mode, PauseKind, PausedRow, Resident,
    SLACK_FORCED_RESUME_FRACTION_OF_D,
};

impl GenPreemption {
    /// Every paused request with its resident row (`None`: no longer resident) and record,
    /// its resume-lane key left unset (`with_lane_keys`). Paused ids, records and residents
    /// are all in id order, so this is one merge, with no search per request.
    pub(super) fn paused_rows<'a>(
        &self,
        residents: &'a [Resident],
    ) -> Vec<(LaneKey, PausedRow<'a>)> {
        let mut res = residents.iter().peekable();
        let mut recs = self.records.iter().peekable();
        self.paused
            .ids()
            .map(|id| {
                let row = PausedRow {
                    id,
                    resident: merge_find(&mut res, id, |r| r.id),
                    record: merge_find(&mut recs, id, |(k, _)| *k).map(|(_, r)| *r),
                };
                ((false, 0.0), row)
            })
            .collect()
    }

    /// Sets the resume-lane key of each row. A key reads only its own row's copy of the
    /// record, so it is the same before or after other rows resume.
    pub(super) fn with_lane_keys(&self, rows: &mut [(LaneKey, PausedRow)], now: f64) {
        for (key, row) in rows.iter_mut() {
            *key = self.lane_key(row, now);
        }
    }

    /// A paused request's key in the mode's resume order (see `lane_order`).
    fn lane_key(&self, row: &PausedRow, now: f64) -> LaneKey {
        match self.params.mode {
            // Least slack first; sacrificed requests after every other paused request.
            Mode::TargetOutputTps(t) => {
                let sacrificed = row.record.is_some_and(|r| r.sacrificed);
                let lax = row.resident.map_or(f64::INFINITY, |r| {
                    self.laxity_of(r, row.record.as_ref(), now, t)
                });
                (sacrificed, lax)
            }
            // Oldest pause first.
            _ => (
                false,
                row.record.and_then(|r| r.paused).map_or(0.0, |p| p.0),
            ),
        }
    }

    pub(super) fn forced_due(&self, row: &PausedRow, now: f64) -> bool {
        let Some(rec) = row.record else {
            return true;
        };
        let Some((since, kind)) = rec.paused else {
            return false;
        };
        if now - since >= self.max_pause() {
            return true;
        }
        match (self.params.mode, kind) {
            (Mode::TargetOutputTps(t), PauseKind::Slack) => {
                let d = self.stats.d().unwrap_or(0.0);
                row.resident.is_some_and(|r| {
                    self.laxity_of(r, Some(&rec), now, t) <= SLACK_FORCED_RESUME_FRACTION_OF_D * d
                })
            }
            _ => false,
        }
    }
}

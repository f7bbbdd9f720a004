//! A request's pause history, and the per-request pause limits (SPEC §4.3): the one place
//! they are checked.

use serde::Serialize;

/// `tpot_budget`: pauses per request.
pub const BUDGET_PAUSES_PER_REQUEST: u32 = 2;
/// `target_output_tps`: slack-bounded pauses per request.
pub const SLACK_PAUSES_PER_REQUEST: u32 = 8;
/// `target_output_tps`: pauses per request below the target (or sacrificed).
pub const BELOW_PAUSES_PER_REQUEST: u32 = 3;

/// The per-request pause limits a controller runs with: SPEC §4.3's by default. Only
/// `tpot_budget`'s can move, by the simulator's `pauses=` ablation (docs/results.md §3.1),
/// which measures what the limit trades: the TTFT gain and the mean TPOT against the E2E tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PauseLimits {
    /// `tpot_budget`: pauses per request.
    pub budget: u32,
}

impl Default for PauseLimits {
    fn default() -> Self {
        Self {
            budget: BUDGET_PAUSES_PER_REQUEST,
        }
    }
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
pub(super) struct Record {
    pub pauses: u8,
    pub slack_pauses: u8,
    pub below_pauses: u8,
    pub sacrificed: bool,
    /// Seconds paused in pauses that have ended.
    pub paused_total: f64,
    /// Decode iterations at the last resume.
    pub iters_at_resume: u32,
    /// The open pause: since when, and which kind.
    pub paused: Option<(f64, PauseKind)>,
}

impl Record {
    /// Seconds paused up to `now`, the open pause included.
    pub fn paused_through(&self, now: f64) -> f64 {
        self.paused_total + self.paused.map_or(0.0, |(since, _)| (now - since).max(0.0))
    }

    /// Whether the request's limit for pauses of `kind` leaves it another one.
    pub fn may_pause(&self, kind: PauseKind, limits: PauseLimits) -> bool {
        let (taken, limit) = match kind {
            PauseKind::Budget => (self.pauses, limits.budget),
            PauseKind::Slack => (self.slack_pauses, SLACK_PAUSES_PER_REQUEST),
            // A sacrifice is a pause below the target too, and counts as one.
            PauseKind::Below | PauseKind::Sacrifice => {
                (self.below_pauses, BELOW_PAUSES_PER_REQUEST)
            }
        };
        u32::from(taken) < limit
    }

    /// Opens a pause of `kind` at `now` and counts it.
    pub fn start_pause(&mut self, kind: PauseKind, now: f64) {
        // Saturating: the limits stop each count long before a byte would wrap.
        self.pauses = self.pauses.saturating_add(1);
        match kind {
            PauseKind::Slack => self.slack_pauses = self.slack_pauses.saturating_add(1),
            PauseKind::Below => self.below_pauses = self.below_pauses.saturating_add(1),
            PauseKind::Sacrifice => {
                self.below_pauses = self.below_pauses.saturating_add(1);
                self.sacrificed = true;
            }
            PauseKind::Budget => {}
        }
        self.paused = Some((now, kind));
    }

    /// Ends the open pause at `now`; `iters` is the request's decode iterations then.
    pub fn end_pause(&mut self, iters: u32, now: f64) {
        if let Some((since, _)) = self.paused.take() {
            self.paused_total += (now - since).max(0.0);
        }
        self.iters_at_resume = iters;
    }

    /// Decode iterations since the last resume (all of them for a request never paused).
    pub fn iters_since_resume(record: Option<&Record>, iters: u32) -> u32 {
        iters - record.map_or(0, |r| r.iters_at_resume.min(iters))
    }
}

/// [`Record::may_pause`] for a request that may have no record (never paused: every limit
/// leaves it one).
pub(super) fn may_pause(record: Option<&Record>, kind: PauseKind, limits: PauseLimits) -> bool {
    record.is_none_or(|r| r.may_pause(kind, limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: PauseLimits = PauseLimits {
        budget: BUDGET_PAUSES_PER_REQUEST,
    };

    #[test]
    fn each_kind_of_pause_counts_against_its_own_limit() {
        let mut r = Record::default();
        for _ in 0..BUDGET_PAUSES_PER_REQUEST {
            assert!(r.may_pause(PauseKind::Budget, SPEC));
            r.start_pause(PauseKind::Budget, 0.0);
            r.end_pause(0, 1.0);
        }
        assert!(!r.may_pause(PauseKind::Budget, SPEC));
        assert!(r.may_pause(PauseKind::Slack, SPEC) && r.may_pause(PauseKind::Below, SPEC));

        let mut r = Record::default();
        for _ in 0..BELOW_PAUSES_PER_REQUEST - 1 {
            r.start_pause(PauseKind::Below, 0.0);
        }
        assert!(r.may_pause(PauseKind::Sacrifice, SPEC));
        r.start_pause(PauseKind::Sacrifice, 0.0);
        assert!(r.sacrificed);
        assert!(!r.may_pause(PauseKind::Below, SPEC) && !r.may_pause(PauseKind::Sacrifice, SPEC));
        assert!(may_pause(None, PauseKind::Budget, SPEC));
    }

    #[test]
    fn paused_time_adds_the_open_pause_and_a_resume_closes_it() {
        let mut r = Record::default();
        r.start_pause(PauseKind::Budget, 10.0);
        assert_eq!(r.paused_through(12.5), 2.5);
        r.end_pause(300, 13.0);
        assert_eq!(
            (r.paused_total, r.iters_at_resume, r.paused),
            (3.0, 300, None)
        );
        assert_eq!(Record::iters_since_resume(Some(&r), 364), 64);
        assert_eq!(Record::iters_since_resume(None, 364), 364);
    }
}

//! `target_output_tps` victim (SPEC §4.3, tiers 1–3), found without a laxity for every
//! resident.
//!
//! A request's laxity never exceeds its deadline minus now: the projected finish is now plus
//! a non-negative time, and f64 rounding is monotone, so the computed laxity obeys the bound
//! the exact one does. Tier 1 takes the largest laxity at or above 0.02 D, so a resident whose
//! bound is below that floor, or below the best laxity found so far, cannot be its choice.
//! That bound rarely rules a request out, since most of a laxity is the remaining decode
//! time, so a request that passes it is next ruled out, when it can be, on an estimate of its
//! laxity from the TPOT its eligibility test computed. Both are estimates with a margin
//! (`objective::Estimate`): a multiplication by 1/T for the deadline, one for the remaining
//! time, where the laxity divides four times. Only requests whose estimate comes within its
//! margin of the best so far get their laxity computed, so the choice is exactly the one
//! computing every laxity would make. (Starting the walk at the previous pass's runner-up
//! cost more in bookkeeping than it saved.) Tiers 2 and 3 matter only when tier 1 has no
//! candidate, and only then are walked.

use super::idmap::{merge_find, IdOrder};
use super::objective::{deadline_slack_estimate, laxity, laxity_estimate, Estimate};
use super::record::PauseKind;
use super::victim::{largest_slack_first, Candidate, Eligibility, Tpot};
use super::{GenPreemption, StepView, SLACK_TIER_MIN_FRACTION_OF_D};
use crate::ids::RequestId;

/// The best tier-1 candidate so far: its laxity and id.
type LaxityAndId = (f64, RequestId);

impl GenPreemption {
    /// The target-mode victim for this pass.
    pub(super) fn target_victim(
        &self,
        view: &StepView,
        target: f64,
    ) -> Option<(RequestId, PauseKind)> {
        let eligibility = self.eligibility(view.now);
        let fallback = self.stats.r0().unwrap_or(target);
        let floor = SLACK_TIER_MIN_FRACTION_OF_D * self.stats.d().unwrap_or(0.0);
        let inverse_target = 1.0 / target;
        let mut best: Option<LaxityAndId> = None;
        // Newest first: later first tokens mostly mean later deadlines, so the best
        // laxity found early bounds out more of the older residents. The choice is a
        // maximum under a total order, the same in any walk order.
        // A paused request's record says so (`paused` and the records agree), so one merge
        // answers both questions.
        let mut records = self.records.iter().rev().peekable();
        for r in view.residents.iter().rev() {
            // No first token: not eligible. A NaN bound rules nothing out.
            let Some(ft) = r.first_token_time else {
                continue;
            };
            let slack = deadline_slack_estimate(ft, r.max_tokens, inverse_target, view.now);
            // Below the floor or below the best so far: the laxity is too.
            let short = |e: Estimate| e.below(floor) || best.is_some_and(|(b, _)| e.below(b));
            if short(slack) {
                continue;
            }
            let record =
                merge_find(IdOrder::Descending, &mut records, r.id, |(id, _)| *id).map(|(_, x)| x);
            // Paused, sacrificed (tier 2's), or out of slack-bounded pauses.
            if record.is_some_and(|x| {
                x.paused.is_some()
                    || x.sacrificed
                    || !x.may_pause(PauseKind::Slack, self.params.limits)
            }) {
                continue;
            }
            let Some((state, tpot)) = Self::eligible_rate(&eligibility, r, record) else {
                continue;
            };
            if let Tpot::Own(tpot) = tpot {
                let remaining = r.max_tokens.saturating_sub(r.output_tokens);
                if short(laxity_estimate(slack, remaining, tpot)) {
                    continue;
                }
            }
            let lax = laxity(&state, view.now, target, fallback);
            if lax >= floor && best.is_none_or(|b| largest_slack_first((lax, r.id), b).is_lt()) {
                best = Some((lax, r.id));
            }
        }
        if let Some((_, id)) = best {
            return Some((id, PauseKind::Slack));
        }
        self.below_or_sacrifice(view, &eligibility, target, fallback)
    }

    /// Tiers 2 and 3, for a pass whose tier 1 has no candidate: both choose by the victim
    /// rule, among the candidates with below-target pauses left.
    fn below_or_sacrifice(
        &self,
        view: &StepView,
        eligibility: &Eligibility,
        target: f64,
        fallback: f64,
    ) -> Option<(RequestId, PauseKind)> {
        let rule = self.params.victim_key;
        let better =
            |best: Option<Candidate>, c: &Candidate| best.is_none_or(|b| rule.cmp(c, &b).is_lt());
        let mut below: Option<Candidate> = None;
        let mut sacrifice: Option<Candidate> = None;
        let mut records = self.records.iter().peekable();
        for r in view.residents {
            let record =
                merge_find(IdOrder::Ascending, &mut records, r.id, |(id, _)| *id).map(|(_, x)| x);
            // Paused, or out of below-target pauses (a sacrifice counts as one).
            if record.is_some_and(|x| {
                x.paused.is_some() || !x.may_pause(PauseKind::Below, self.params.limits)
            }) {
                continue;
            }
            let Some((state, tpot)) = Self::eligible_rate(eligibility, r, record) else {
                continue;
            };
            let lax = laxity(&state, view.now, target, fallback);
            let candidate = Candidate {
                resident: r,
                tpot: tpot.secs(),
            };
            let sacrificed = record.is_some_and(|x| x.sacrificed);
            if (lax < 0.0 || sacrificed) && better(below, &candidate) {
                below = Some(candidate);
            }
            if !sacrificed && better(sacrifice, &candidate) {
                sacrifice = Some(candidate);
            }
        }
        if let Some(c) = below {
            return Some((c.resident.id, PauseKind::Below));
        }
        if !self.credit.can_sacrifice() {
            return None;
        }
        sacrifice.map(|c| (c.resident.id, PauseKind::Sacrifice))
    }
}

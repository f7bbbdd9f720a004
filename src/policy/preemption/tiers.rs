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

use std::cmp::Ordering;

use super::objective::{deadline_slack_estimate, laxity, laxity_estimate, Estimate};
use super::victim::{largest_slack_first, Eligibility, Tpot};
use super::{
    merge_find, GenPreemption, PauseKind, Record, Resident, StepView, Walk,
    BELOW_PAUSES_PER_REQUEST, SLACK_PAUSES_PER_REQUEST, SLACK_TIER_MIN_FRACTION_OF_D,
};
use crate::policy::RequestId;

/// A tier-1 candidate: its laxity and id.
type Slack = (f64, RequestId);

impl GenPreemption {
    /// Laxity of an unpaused resident that passes the mode-independent eligibility, `None`
    /// when it is not eligible. The same arithmetic as `eligible` followed by the laxity, with
    /// the rate state computed once.
    fn eligible_laxity(
        el: &Eligibility,
        r: &Resident,
        rec: Option<&Record>,
        target: f64,
        fallback_rate: f64,
    ) -> Option<f64> {
        Self::eligible_rate(el, r, rec).map(|(s, _)| laxity(&s, el.now, target, fallback_rate))
    }

    /// The target-mode victim for this pass.
    pub(super) fn target_victim(
        &self,
        v: &StepView,
        target: f64,
    ) -> Option<(RequestId, PauseKind)> {
        let el = self.eligibility(v.now);
        let fallback = self.stats.r0().unwrap_or(target);
        let floor = SLACK_TIER_MIN_FRACTION_OF_D * self.stats.d().unwrap_or(0.0);
        let inverse_target = 1.0 / target;
        let mut best: Option<Slack> = None;
        // Newest first: later first tokens mostly mean later deadlines, so the best
        // laxity found early bounds out more of the older residents. The choice is a
        // maximum under a total order, the same in any walk order.
        // A paused request's record says so (`paused` and the records agree), so one merge
        // answers both questions.
        let mut recs = self.records.iter().rev().peekable();
        for r in v.residents.iter().rev() {
            // No first token: not eligible. A NaN bound rules nothing out.
            let Some(ft) = r.first_token_time else {
                continue;
            };
            let slack = deadline_slack_estimate(ft, r.max_tokens, inverse_target, v.now);
            // Below the floor or below the best so far: the laxity is too.
            let short = |e: Estimate| e.below(floor) || best.is_some_and(|(b, _)| e.below(b));
            if short(slack) {
                continue;
            }
            let rec = merge_find(Walk::Descending, &mut recs, r.id, |(k, _)| *k).map(|(_, x)| x);
            if rec.is_some_and(|x| {
                x.paused.is_some()
                    || x.sacrificed
                    || u32::from(x.slack_pauses) >= SLACK_PAUSES_PER_REQUEST
            }) {
                continue;
            }
            let Some((s, tpot)) = Self::eligible_rate(&el, r, rec) else {
                continue;
            };
            if let Tpot::Own(tpot) = tpot {
                let remaining = r.max_tokens.saturating_sub(r.output_tokens);
                if short(laxity_estimate(slack, remaining, tpot)) {
                    continue;
                }
            }
            let lax = laxity(&s, el.now, target, fallback);
            if lax >= floor && best.is_none_or(|b| largest_slack_first((lax, r.id), b).is_lt()) {
                best = Some((lax, r.id));
            }
        }
        if let Some((_, id)) = best {
            return Some((id, PauseKind::Slack));
        }
        self.below_or_sacrifice(v, &el, target, fallback)
    }

    /// Tiers 2 and 3, for a pass whose tier 1 has no candidate.
    fn below_or_sacrifice(
        &self,
        v: &StepView,
        el: &Eligibility,
        target: f64,
        fallback: f64,
    ) -> Option<(RequestId, PauseKind)> {
        let key = self.params.victim_key;
        let better = |best: Option<&Resident>, r: &Resident| {
            best.is_none_or(|b| key.cmp(r, b) == Ordering::Less)
        };
        let mut below: Option<&Resident> = None;
        let mut sacrifice: Option<&Resident> = None;
        let mut recs = self.records.iter().peekable();
        for r in v.residents {
            let rec = merge_find(Walk::Ascending, &mut recs, r.id, |(k, _)| *k).map(|(_, x)| x);
            if rec.is_some_and(|x| {
                x.paused.is_some() || u32::from(x.below_pauses) >= BELOW_PAUSES_PER_REQUEST
            }) {
                continue;
            }
            let Some(lax) = Self::eligible_laxity(el, r, rec, target, fallback) else {
                continue;
            };
            let sacrificed = rec.is_some_and(|x| x.sacrificed);
            if (lax < 0.0 || sacrificed) && better(below, r) {
                below = Some(r);
            }
            if !sacrificed && better(sacrifice, r) {
                sacrifice = Some(r);
            }
        }
        if let Some(r) = below {
            return Some((r.id, PauseKind::Below));
        }
        if !self.credit.can_sacrifice() {
            return None;
        }
        sacrifice.map(|r| (r.id, PauseKind::Sacrifice))
    }
}

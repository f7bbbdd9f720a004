//! Which request to pause this pass: the mode-independent eligibility walk and each mode's
//! victim choice (SPEC §4.3, "Pause"). The orderings themselves are key functions in
//! `victim.rs`; this file walks the residents with them.

use super::objective::RateState;
use super::victim::{longest_resident_first, Eligibility, Tpot, VictimKey};
use super::{
    merge_find, GenPreemption, Mode, PauseKind, Record, Resident, StepView, Walk,
    BUDGET_PAUSES_PER_REQUEST,
};
use crate::policy::RequestId;

impl GenPreemption {
    /// An unpaused resident's rate state and the TPOT its eligibility test used, when it is
    /// eligible for a pause under the mode-independent rules.
    pub(super) fn eligible_rate(
        el: &Eligibility,
        r: &Resident,
        rec: Option<&Record>,
    ) -> Option<(RateState, Tpot)> {
        let s = Self::rate_state(r, rec, el.now)?;
        let iters = r.decode_iters - rec.map_or(0, |x| x.iters_at_resume.min(r.decode_iters));
        el.eligible_tpot(r, iters, s.unpaused_decode_s)
            .map(|tpot| (s, tpot))
    }

    /// Unpaused residents eligible for a pause under the mode-independent rules, with their
    /// records. One merge over residents and records (both in id order); a paused request's
    /// record says so.
    fn eligible<'s, 'a: 's>(
        &'s self,
        v: &StepView<'a>,
    ) -> impl Iterator<Item = (&'a Resident, Option<Record>)> + 's {
        let el = self.eligibility(v.now);
        let mut recs = self.records.iter().peekable();
        v.residents.iter().filter_map(move |r| {
            let rec = merge_find(Walk::Ascending, &mut recs, r.id, |(k, _)| *k).map(|(_, x)| *x);
            if rec.is_some_and(|x| x.paused.is_some()) {
                return None;
            }
            Self::eligible_rate(&el, r, rec.as_ref()).map(|_| (r, rec))
        })
    }

    /// `tpot_budget` under the default key (earliest admission; ties newest arrival, then
    /// higher id), walking residents oldest admission first: the victim is among the first
    /// eligible request's admission-time peers, so the walk ends with that group.
    fn longest_resident_victim(
        &self,
        v: &StepView,
        by_admission: &[u32],
    ) -> Option<(RequestId, PauseKind)> {
        debug_assert_eq!(by_admission.len(), v.residents.len());
        let el = self.eligibility(v.now);
        let mut best: Option<&Resident> = None;
        for &place in by_admission {
            let Some(r) = v.residents.get(place as usize) else {
                continue;
            };
            if best.is_some_and(|b| b.admit_time.total_cmp(&r.admit_time).is_lt()) {
                break;
            }
            // A paused request's record says so: one lookup answers both questions.
            let rec = self.records.get(r.id);
            if rec.is_some_and(|x| {
                x.paused.is_some() || u32::from(x.pauses) >= BUDGET_PAUSES_PER_REQUEST
            }) {
                continue;
            }
            if Self::eligible_rate(&el, r, rec).is_some()
                && best.is_none_or(|b| longest_resident_first(r, b).is_lt())
            {
                best = Some(r);
            }
        }
        best.map(|r| (r.id, PauseKind::Budget))
    }

    /// The victim for this pass, if any request is eligible under the mode.
    pub(super) fn choose_victim(&self, v: &StepView) -> Option<(RequestId, PauseKind)> {
        let key = self.params.victim_key;
        match self.params.mode {
            Mode::Off => None,
            Mode::TpotBudget(_) => {
                if let (VictimKey::LongestResident, Some(order)) = (key, v.by_admission) {
                    return self.longest_resident_victim(v, order);
                }
                self.eligible(v)
                    .filter(|(_, rec)| {
                        rec.map_or(0, |x| u32::from(x.pauses)) < BUDGET_PAUSES_PER_REQUEST
                    })
                    .min_by(|a, b| key.cmp(a.0, b.0))
                    .map(|(r, _)| (r.id, PauseKind::Budget))
            }
            Mode::TargetOutputTps(t) => self.target_victim(v, t),
        }
    }
}

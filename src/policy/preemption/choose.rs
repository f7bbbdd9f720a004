//! Which request to pause this pass: the mode-independent eligibility walk and each mode's
//! victim choice (SPEC §4.3, "Pause"). The victim rules themselves are key functions in
//! `victim.rs`; this file walks the residents with them. The reference's `victim` is the same
//! choice by a plain scan.

use super::idmap::{merge_find, IdOrder};
use super::objective::RateState;
use super::record::{may_pause, Record};
use super::victim::{AdmissionEnd, Candidate, Eligibility, Tpot};
use super::{GenPreemption, Mode, PauseKind, Resident, StepView};
use crate::ids::RequestId;

impl GenPreemption {
    /// The victim for this pass, if any request is eligible under the mode.
    pub(super) fn choose_victim(&self, view: &StepView) -> Option<(RequestId, PauseKind)> {
        match self.params.mode {
            Mode::Off => None,
            Mode::TpotBudget(_) => self.budget_victim(view).map(|id| (id, PauseKind::Budget)),
            Mode::TargetOutputTps(t) => self.target_victim(view, t),
        }
    }

    /// An unpaused resident's rate state and the TPOT its eligibility test used, when it is
    /// eligible for a pause under the mode-independent rules.
    pub(super) fn eligible_rate(
        eligibility: &Eligibility,
        r: &Resident,
        record: Option<&Record>,
    ) -> Option<(RateState, Tpot)> {
        let state = Self::rate_state(r, record, eligibility.now)?;
        let iters = Record::iters_since_resume(record, r.decode_iters);
        eligibility
            .eligible_tpot(r, iters, state.unpaused_decode_s)
            .map(|tpot| (state, tpot))
    }

    /// Unpaused residents eligible for a pause under the mode-independent rules, with their
    /// records. One merge over residents and records (both in id order); a paused request's
    /// record says so.
    fn candidates<'s, 'a: 's>(
        &'s self,
        view: &StepView<'a>,
    ) -> impl Iterator<Item = (Candidate<'a>, Option<&'s Record>)> + 's {
        let eligibility = self.eligibility(view.now);
        let mut records = self.records.iter().peekable();
        view.residents.iter().filter_map(move |r| {
            let record =
                merge_find(IdOrder::Ascending, &mut records, r.id, |(id, _)| *id).map(|(_, x)| x);
            if record.is_some_and(|x| x.paused.is_some()) {
                return None;
            }
            let (_, tpot) = Self::eligible_rate(&eligibility, r, record)?;
            let candidate = Candidate {
                resident: r,
                tpot: tpot.secs(),
            };
            Some((candidate, record))
        })
    }

    /// `tpot_budget`: the first candidate under the victim rule that has pauses left. A rule
    /// that prefers one end of the admission order walks the residents from there when the
    /// caller keeps that order.
    fn budget_victim(&self, view: &StepView) -> Option<RequestId> {
        let rule = self.params.victim_key;
        match (rule.admission_walk(), view.by_admission) {
            (Some(AdmissionEnd::Oldest), Some(order)) => self.admission_walk(view, order.iter()),
            (Some(AdmissionEnd::Newest), Some(order)) => {
                self.admission_walk(view, order.iter().rev())
            }
            _ => self
                .candidates(view)
                .filter(|(_, record)| may_pause(*record, PauseKind::Budget, self.params.limits))
                .min_by(|a, b| rule.cmp(&a.0, &b.0))
                .map(|(c, _)| c.resident.id),
        }
    }

    /// `budget_victim` for a rule whose first key is the admission time, walking residents
    /// from its preferred end (`places`): the victim is among the first admission time met
    /// that has a candidate, so the walk ends with that group.
    fn admission_walk<'p>(
        &self,
        view: &StepView,
        places: impl Iterator<Item = &'p u32>,
    ) -> Option<RequestId> {
        let rule = self.params.victim_key;
        let eligibility = self.eligibility(view.now);
        let mut best: Option<Candidate> = None;
        for &place in places {
            let Some(r) = view.residents.get(place as usize) else {
                continue;
            };
            if best.is_some_and(|b| b.resident.admit_time.total_cmp(&r.admit_time).is_ne()) {
                break;
            }
            // A paused request's record says so: one lookup answers both questions.
            let record = self.records.get(r.id);
            let limits = self.params.limits;
            if record.is_some_and(|x| x.paused.is_some() || !x.may_pause(PauseKind::Budget, limits))
            {
                continue;
            }
            let Some((_, tpot)) = Self::eligible_rate(&eligibility, r, record) else {
                continue;
            };
            let candidate = Candidate {
                resident: r,
                tpot: tpot.secs(),
            };
            if best.is_none_or(|b| rule.cmp(&candidate, &b).is_lt()) {
                best = Some(candidate);
            }
        }
        best.map(|c| c.resident.id)
    }
}

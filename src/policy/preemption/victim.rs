//! Victim eligibility and the victim rules: which eligible request a pause takes. Each rule
//! is one small key function, so a new one is a few lines here (see `VictimKey`).

use std::cmp::Ordering;

use super::objective::own_tpot;
use super::Resident;
use crate::ids::RequestId;

/// Decode iterations a request must run after a resume before it can be paused again.
pub const MIN_ITERS_SINCE_RESUME: u32 = 64;
/// Minimum decode time before a pause, as a fraction of D.
pub const MIN_DECODE_FRACTION_OF_D: f64 = 0.07;
/// Minimum decode time before the first completion (no D yet).
pub const MIN_DECODE_BEFORE_D_S: f64 = 2.0;

/// The thresholds of eligibility for the current pass.
#[derive(Debug, Clone, Copy)]
pub struct Eligibility {
    pub now: f64,
    /// 0.07 D, or 2 s before the first completion.
    pub min_decode_s: f64,
    /// Fallback TPOT (1 / R0) for requests too young to have their own.
    pub fallback_tpot: f64,
}

/// The TPOT a rule uses for a request: its own, or the fallback while it is too young.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tpot {
    /// Unpaused decode time per token after the first.
    Own(f64),
    /// 1 / R0: the request has produced too little to measure.
    Fallback(f64),
}

impl Tpot {
    pub fn secs(self) -> f64 {
        match self {
            Tpot::Own(t) | Tpot::Fallback(t) => t,
        }
    }
}

impl Eligibility {
    /// The request's own unpaused TPOT, or the fallback while it has produced too little.
    pub fn tpot(&self, r: &Resident, unpaused_decode_s: f64) -> Tpot {
        own_tpot(r.output_tokens, unpaused_decode_s)
            .map_or(Tpot::Fallback(self.fallback_tpot), Tpot::Own)
    }

    /// A request is "near finished" when its remaining tokens at its own unpaused TPOT
    /// would take less than the minimum decode time (0.07 D): pausing it buys a slot for
    /// only a moment and makes a nearly done request late.
    pub fn near_finished(&self, r: &Resident, unpaused_decode_s: f64) -> bool {
        self.near_finished_at(r, self.tpot(r, unpaused_decode_s))
    }

    fn near_finished_at(&self, r: &Resident, tpot: Tpot) -> bool {
        let remaining = r.max_tokens.saturating_sub(r.output_tokens) as f64;
        remaining * tpot.secs() < self.min_decode_s
    }

    /// Mode-independent eligibility: first token out, decoding long enough, enough
    /// iterations since the last resume, not near finished.
    pub fn eligible(&self, r: &Resident, iters_since_resume: u32, unpaused_decode_s: f64) -> bool {
        self.eligible_tpot(r, iters_since_resume, unpaused_decode_s)
            .is_some()
    }

    /// `eligible`, answering the TPOT its near-finished test used when the request is
    /// eligible (the target mode's laxity estimate reuses it).
    pub fn eligible_tpot(
        &self,
        r: &Resident,
        iters_since_resume: u32,
        unpaused_decode_s: f64,
    ) -> Option<Tpot> {
        let ft = r.first_token_time?;
        if !(self.now - ft >= self.min_decode_s && iters_since_resume >= MIN_ITERS_SINCE_RESUME) {
            return None;
        }
        let tpot = self.tpot(r, unpaused_decode_s);
        (!self.near_finished_at(r, tpot)).then_some(tpot)
    }
}

/// A pause candidate as a victim rule sees it: an unpaused resident that passed the
/// mode-independent eligibility.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub resident: &'a Resident,
    /// Seconds per token: its own unpaused TPOT, or 1/R0 while it has produced too little to
    /// measure (the TPOT its near-finished test used).
    pub tpot: f64,
}

impl Candidate<'_> {
    /// Tokens left before `max_tokens`.
    pub fn remaining_tokens(&self) -> u32 {
        let r = self.resident;
        r.max_tokens.saturating_sub(r.output_tokens)
    }
}

/// `tpot_budget` victim order: the longest-resident request first (earliest admission);
/// ties go to the newest arrival, then the higher id. `Less` means "pause first".
pub fn longest_resident_first(a: &Resident, b: &Resident) -> Ordering {
    a.admit_time
        .total_cmp(&b.admit_time)
        .then(b.arrival.total_cmp(&a.arrival))
        .then(b.id.cmp(&a.id))
}

/// The victim rule: which eligible request `tpot_budget` pauses, and which one the target
/// mode's sacrifice tier (and tier 2) pauses. The default is the SPEC's; the others are
/// ablations for the simulator, where each is an arm by its serde name
/// (`victim=newest_resident`).
///
/// A new rule is a variant here: its doc, its arm in `cmp`, and, when its first key is the
/// admission time, its arm in `admission_walk`. Nothing else names the variants: the arm
/// parser, its error message and the property tests against the reference
/// (`reference.rs`) find every variant through `policy::names`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VictimKey {
    /// Earliest admission first (the default; SPEC §4.3).
    #[default]
    LongestResident,
    /// Latest admission first.
    NewestResident,
    /// Most remaining tokens first.
    MostRemaining,
    /// Fewest remaining tokens first.
    FewestRemaining,
}

/// Which end of the admission order a walk starts from (see [`VictimKey::admission_walk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionEnd {
    Oldest,
    Newest,
}

impl VictimKey {
    /// The rule's order: `Less` means `a` is paused first. A total order (every rule ends in
    /// `longest_resident_first`, whose last key is the id), so any walk over the candidates
    /// finds the same victim.
    pub fn cmp(self, a: &Candidate, b: &Candidate) -> Ordering {
        let tie = || longest_resident_first(a.resident, b.resident);
        let admitted = |c: &Candidate| c.resident.admit_time;
        match self {
            VictimKey::LongestResident => tie(),
            VictimKey::NewestResident => admitted(b).total_cmp(&admitted(a)).then_with(tie),
            VictimKey::MostRemaining => b
                .remaining_tokens()
                .cmp(&a.remaining_tokens())
                .then_with(tie),
            VictimKey::FewestRemaining => a
                .remaining_tokens()
                .cmp(&b.remaining_tokens())
                .then_with(tie),
        }
    }

    /// For a rule whose first key is the admission time, the end of the admission order
    /// (`StepView::by_admission`) it prefers: walking from there, the victim is among the
    /// first admission time that has an eligible request, so the walk stops after that group
    /// instead of scanning every resident. `None`: the rule needs every candidate.
    pub fn admission_walk(self) -> Option<AdmissionEnd> {
        match self {
            VictimKey::LongestResident => Some(AdmissionEnd::Oldest),
            VictimKey::NewestResident => Some(AdmissionEnd::Newest),
            VictimKey::MostRemaining | VictimKey::FewestRemaining => None,
        }
    }
}

/// Target-mode victim tier 1 order: the largest laxity first; ties by id.
pub fn largest_slack_first(a: (f64, RequestId), b: (f64, RequestId)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

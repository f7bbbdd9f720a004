//! Victim eligibility and the orderings over victims and the resume lane. Each ordering is
//! one small key function, so a new strategy is a few lines here.

use std::cmp::Ordering;

use super::super::RequestId;
use super::objective::own_tpot;
use super::Resident;

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

/// `tpot_budget` victim order: the longest-resident request first (earliest admission);
/// ties go to the newest arrival, then the higher id. `Less` means "pause first".
pub fn longest_resident_first(a: &Resident, b: &Resident) -> Ordering {
    a.admit_time
        .total_cmp(&b.admit_time)
        .then(b.arrival.total_cmp(&a.arrival))
        .then(b.id.cmp(&a.id))
}

/// Alternative victim orders, for ablations in the simulator.
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

impl VictimKey {
    pub fn cmp(self, a: &Resident, b: &Resident) -> Ordering {
        let rem = |r: &Resident| r.max_tokens.saturating_sub(r.output_tokens);
        let tie = || longest_resident_first(a, b);
        match self {
            VictimKey::LongestResident => tie(),
            VictimKey::NewestResident => b.admit_time.total_cmp(&a.admit_time).then_with(tie),
            VictimKey::MostRemaining => rem(b).cmp(&rem(a)).then_with(tie),
            VictimKey::FewestRemaining => rem(a).cmp(&rem(b)).then_with(tie),
        }
    }
}

/// Target-mode victim tier 1 order: the largest laxity first; ties by id.
pub fn largest_slack_first(a: (f64, RequestId), b: (f64, RequestId)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

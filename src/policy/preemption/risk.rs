//! When the queue's head is at risk (SPEC §4.3): the rule that lets a pass pause. The queue
//! reports the head's slack; what counts as "at risk" is the controller's, per mode.

use super::Mode;

/// Whether a head with this slack is at risk for the window `w`. Never without a target
/// (`None`: empty queue or X not formed). An on-time head blocks: a later waiter at risk does
/// not count while the head is not.
///
/// - `tpot_budget`: within W of X on either side, `−W ≤ slack < W`. A head that missed X by
///   more than W cannot be brought under the percentile by one pause (the overdue tier
///   serves it); counting it would make every slot turnover under saturation a pause,
///   whatever g says, and g would lose its authority over the TPOT inflation.
/// - `target_output_tps`: `slack < W`, late heads included: there the victim tiers and the
///   credit bound what pauses cost, not W.
pub fn head_at_risk(mode: Mode, head_slack: Option<f64>, w: f64) -> bool {
    let Some(slack) = head_slack else {
        return false;
    };
    match mode {
        Mode::Off => false,
        Mode::TpotBudget(_) => -w <= slack && slack < w,
        Mode::TargetOutputTps(_) => slack < w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Mode = Mode::TpotBudget(0.1);
    const TARGET: Mode = Mode::TargetOutputTps(30.0);

    #[test]
    fn tpot_budget_head_late_by_more_than_w_is_not_at_risk() {
        let w = 2.0;
        assert!(!head_at_risk(BUDGET, Some(-2.5), w), "late by more than W");
        assert!(head_at_risk(BUDGET, Some(-2.0), w), "late by exactly W");
        assert!(head_at_risk(BUDGET, Some(-0.5), w), "late by less than W");
        assert!(head_at_risk(BUDGET, Some(1.9), w), "on time, inside W");
        assert!(!head_at_risk(BUDGET, Some(2.0), w), "slack W is outside");
    }

    #[test]
    fn target_output_tps_counts_every_late_head() {
        let w = 2.0;
        assert!(head_at_risk(TARGET, Some(-50.0), w));
        assert!(head_at_risk(TARGET, Some(-0.5), w));
        assert!(head_at_risk(TARGET, Some(1.9), w));
        assert!(!head_at_risk(TARGET, Some(2.0), w));
    }

    #[test]
    fn nothing_is_at_risk_without_a_target_or_a_mode() {
        for mode in [BUDGET, TARGET, Mode::Off] {
            assert!(!head_at_risk(mode, None, 5.0));
        }
        assert!(!head_at_risk(Mode::Off, Some(-1.0), 5.0));
    }
}

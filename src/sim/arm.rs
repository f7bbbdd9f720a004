//! Arms of a simulation: `control`, `tpot_budget=0.10`, `target_output_tps=auto`,
//! `max_batch_size=144`, and combinations joined by `+`
//! (e.g. `tpot_budget=0.10+order=edf`, `tpot_budget=0.10+victim=newest_resident`,
//! `tpot_budget=0.10+g0=0.25`: where the window gain g starts, `tpot_budget=0.10+pauses=4`:
//! pauses per request, an ablation of SPEC §4.3's 2). A value is refused by the
//! rule the config applies to the same setting (`crate::config::rule`), naming the arm.

use serde::Serialize;

use crate::config::{rule, MAX_ROWS};
use crate::policy::names;
use crate::policy::preemption::controller::{GainFrom, G_MAX, G_MIN};
use crate::policy::preemption::victim::VictimKey;
use crate::policy::AdmissionPolicy;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSpec {
    Off,
    TpotBudget(f64),
    /// `None` = auto: the control arm's mean per-request output rate / 1.10.
    TargetOutputTps(Option<f64>),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmSpec {
    pub name: String,
    pub mode: ModeSpec,
    pub max_batch_size: Option<u32>,
    pub max_active: Option<u32>,
    pub order: Option<AdmissionPolicy>,
    pub victim: Option<VictimKey>,
    /// Where `tpot_budget`'s window gain g starts (default 1).
    pub g0: Option<f64>,
    /// Which completions step g (`g_from=any|paused`); unset: the config's `gain_from`, else
    /// `any` (SPEC §4.3).
    pub gain_from: Option<GainFrom>,
    /// `tpot_budget`'s pauses per request (`pauses=N`); unset: SPEC §4.3's 2.
    pub pauses: Option<u32>,
}

/// The most pauses per request `pauses=` takes: past it, the limit no longer binds on any
/// load measured (docs/results.md §3.1), and a request's pause counts are bytes.
pub const MAX_PAUSES_PER_REQUEST: u32 = 16;

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("bad arm `{arm}`: {why} (examples: control, tpot_budget=0.10, target_output_tps=auto, max_batch_size=144, tpot_budget=0.1+order=edf, tpot_budget=0.1+victim=newest_resident, tpot_budget=0.1+g0=0.25, tpot_budget=0.1+g_from=paused, tpot_budget=0.1+pauses=4)")]
pub struct ArmError {
    pub arm: String,
    pub why: String,
}

/// The keys an arm's `key=value` parts may name (`control` stands alone).
pub const KEYS: [&str; 9] = [
    "tpot_budget",
    "target_output_tps",
    "max_batch_size",
    "max_num_active_requests",
    "order",
    "victim",
    "g0",
    "g_from",
    "pauses",
];

/// A rule enum's variant by its serde name (or an alias, such as `guard-first`); the error
/// lists every valid name, from the enum itself.
fn rule<T>(key: &str, value: &str) -> Result<T, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq,
{
    names::parse(value).map_err(|_| format!("unknown {key} `{value}` ({})", names::listed::<T>()))
}

impl ArmSpec {
    pub fn control() -> Self {
        ArmSpec {
            name: "control".into(),
            mode: ModeSpec::Off,
            max_batch_size: None,
            max_active: None,
            order: None,
            victim: None,
            g0: None,
            gain_from: None,
            pauses: None,
        }
    }

    pub fn parse(text: &str) -> Result<Self, ArmError> {
        let err = |why: String| ArmError {
            arm: text.to_string(),
            why,
        };
        let mut arm = ArmSpec {
            name: text.trim().to_string(),
            ..ArmSpec::control()
        };
        let mut seen: Vec<&str> = Vec::new();
        for part in text.split('+').map(str::trim) {
            if part == "control" {
                continue;
            }
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err(format!("`{part}` is not key=value")))?;
            if seen.contains(&k) {
                return Err(err(format!("`{k}` is given twice")));
            }
            seen.push(k);
            let num = |v: &str| {
                v.parse::<f64>()
                    .map_err(|_| err(format!("`{v}` is not a number")))
            };
            // A size as the config bounds it (`max_batch_size`, `max_num_active_requests`).
            let rows = |v: &str| {
                let n = v
                    .parse::<u64>()
                    .map_err(|_| err(format!("`{v}` is not a whole number")))?;
                rule::count(n, MAX_ROWS).map_err(|why| err(format!("{k} {why}")))?;
                u32::try_from(n).map_err(|_| err(format!("{k} {n} does not fit")))
            };
            match k {
                "tpot_budget" => {
                    let b = num(v)?;
                    rule::tpot_budget(b).map_err(|why| err(format!("tpot_budget {why}")))?;
                    if arm.mode != ModeSpec::Off {
                        return Err(err(
                            "tpot_budget and target_output_tps are mutually exclusive".into(),
                        ));
                    }
                    arm.mode = ModeSpec::TpotBudget(b);
                }
                "target_output_tps" => {
                    if arm.mode != ModeSpec::Off {
                        return Err(err(
                            "tpot_budget and target_output_tps are mutually exclusive".into(),
                        ));
                    }
                    arm.mode = if v == "auto" {
                        ModeSpec::TargetOutputTps(None)
                    } else {
                        let t = num(v)?;
                        rule::target_output_tps(t)
                            .map_err(|why| err(format!("target_output_tps {why}")))?;
                        ModeSpec::TargetOutputTps(Some(t))
                    };
                }
                "max_batch_size" => arm.max_batch_size = Some(rows(v)?),
                "max_num_active_requests" => arm.max_active = Some(rows(v)?),
                "order" => arm.order = Some(rule::<AdmissionPolicy>("order", v).map_err(err)?),
                "victim" => arm.victim = Some(rule::<VictimKey>("victim", v).map_err(err)?),
                "g0" => {
                    let g = num(v)?;
                    rule::finite_within(g, G_MIN, G_MAX).map_err(|why| err(format!("g0 {why}")))?;
                    arm.g0 = Some(g);
                }
                "g_from" => arm.gain_from = Some(rule::<GainFrom>("g_from", v).map_err(err)?),
                "pauses" => {
                    let n = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=MAX_PAUSES_PER_REQUEST).contains(n))
                        .ok_or_else(|| {
                            err(format!(
                                "pauses must be a whole number in [1, {MAX_PAUSES_PER_REQUEST}], got {v}"
                            ))
                        })?;
                    arm.pauses = Some(n);
                }
                _ => {
                    return Err(err(format!(
                        "unknown key `{k}` (one of {}; or control alone)",
                        KEYS.join(", ")
                    )))
                }
            }
        }
        for (key, about) in [
            ("g0", "the window gain"),
            ("g_from", "the window gain"),
            ("pauses", "pauses per request"),
        ] {
            if seen.contains(&key) && !matches!(arm.mode, ModeSpec::TpotBudget(_)) {
                return Err(err(format!(
                    "{key} is about tpot_budget's {about}: it needs tpot_budget="
                )));
            }
        }
        Ok(arm)
    }

    /// The arms of a comma-separated list, each once (a second run of an arm would only
    /// repeat the first, and the tables would name two arms alike).
    pub fn parse_list(text: &str) -> Result<Vec<Self>, ArmError> {
        let mut arms: Vec<Self> = Vec::new();
        for part in text.split(',').filter(|s| !s.trim().is_empty()) {
            let arm = Self::parse(part)?;
            let same = |a: &Self| {
                a.name == arm.name
                    || *a
                        == ArmSpec {
                            name: a.name.clone(),
                            ..arm.clone()
                        }
            };
            if arms.iter().any(same) {
                return Err(ArmError {
                    arm: arm.name,
                    why: "listed twice".into(),
                });
            }
            arms.push(arm);
        }
        Ok(arms)
    }

    pub fn is_control(&self) -> bool {
        *self
            == ArmSpec {
                name: self.name.clone(),
                ..ArmSpec::control()
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arm_listed_twice_or_a_key_given_twice_is_refused() {
        let e = ArmSpec::parse_list("control,tpot_budget=0.1,control").unwrap_err();
        assert_eq!(
            (e.arm.as_str(), e.why.as_str()),
            ("control", "listed twice")
        );
        let e = ArmSpec::parse_list("tpot_budget=0.1,tpot_budget=0.10").unwrap_err();
        assert_eq!(e.why, "listed twice", "the same arm written two ways");
        let e = ArmSpec::parse("tpot_budget=0.1+g0=0.25+g0=2").unwrap_err();
        assert_eq!(e.why, "`g0` is given twice");
        assert_eq!(
            ArmSpec::parse_list("control,tpot_budget=0.1,tpot_budget=0.1+g0=0.5")
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn parses_the_reference_arms() {
        let arms = ArmSpec::parse_list(
            "control,tpot_budget=0.10,target_output_tps=auto,max_batch_size=144",
        )
        .unwrap();
        assert!(arms[0].is_control());
        assert_eq!(arms[1].mode, ModeSpec::TpotBudget(0.10));
        assert_eq!(arms[2].mode, ModeSpec::TargetOutputTps(None));
        assert_eq!(arms[3].max_batch_size, Some(144));
        assert!(!arms[3].is_control());
    }

    #[test]
    fn combinations_and_errors() {
        let a = ArmSpec::parse("tpot_budget=0.1+order=edf+victim=newest_resident").unwrap();
        assert_eq!(a.order, Some(AdmissionPolicy::Edf));
        let v1 = ArmSpec::parse("order=guard_first").unwrap();
        assert_eq!(v1.order, Some(AdmissionPolicy::GuardFirst));
        assert_eq!(a.victim, Some(VictimKey::NewestResident));
        assert!(ArmSpec::parse("tpot_budget=0.1+target_output_tps=3").is_err());
        assert!(ArmSpec::parse("tpot_budget=2").is_err());
        assert!(ArmSpec::parse("bogus=1").is_err());
        assert!(ArmSpec::parse("max_batch_size").is_err());
    }

    #[test]
    fn every_pop_order_and_victim_rule_is_an_arm_by_its_serde_name() {
        for order in names::all::<AdmissionPolicy>() {
            let text = format!("tpot_budget=0.1+order={}", names::name(&order));
            assert_eq!(ArmSpec::parse(&text).unwrap().order, Some(order), "{text}");
        }
        for victim in names::all::<VictimKey>() {
            let text = format!("tpot_budget=0.1+victim={}", names::name(&victim));
            assert_eq!(
                ArmSpec::parse(&text).unwrap().victim,
                Some(victim),
                "{text}"
            );
        }
        // The old spelling stays an alias.
        assert_eq!(
            ArmSpec::parse("order=guard-first").unwrap().order,
            Some(AdmissionPolicy::GuardFirst)
        );
    }

    #[test]
    fn an_unknown_order_or_victim_names_every_valid_one() {
        let e = ArmSpec::parse("order=lifo").unwrap_err();
        for order in names::all::<AdmissionPolicy>() {
            assert!(e.why.contains(&names::name(&order)), "{}", e.why);
        }
        let e = ArmSpec::parse("victim=random").unwrap_err();
        assert!(e.why.starts_with("unknown victim `random` ("), "{}", e.why);
        for victim in names::all::<VictimKey>() {
            assert!(e.why.contains(&names::name(&victim)), "{}", e.why);
        }
    }

    #[test]
    fn an_unknown_key_names_every_valid_one() {
        let e = ArmSpec::parse("tpot=0.1").unwrap_err();
        assert!(e.why.starts_with("unknown key `tpot` ("), "{}", e.why);
        for key in KEYS.iter().chain(&["control"]) {
            assert!(e.why.contains(key), "{key}: {}", e.why);
        }
        // Every listed key is one the parser takes.
        for key in KEYS {
            let text = match key {
                "target_output_tps" => "target_output_tps=auto".to_string(),
                "order" => "order=edf".to_string(),
                "victim" => "victim=newest_resident".to_string(),
                "g0" => "tpot_budget=0.1+g0=0.5".to_string(),
                "g_from" => "tpot_budget=0.1+g_from=paused".to_string(),
                "pauses" => "tpot_budget=0.1+pauses=4".to_string(),
                "tpot_budget" => "tpot_budget=0.1".to_string(),
                _ => format!("{key}=8"),
            };
            assert!(ArmSpec::parse(&text).is_ok(), "{text}");
        }
    }

    #[test]
    fn an_arms_sizes_and_preemption_settings_keep_the_configs_rules_and_name_the_arm() {
        for (arm, says) in [
            (
                "max_batch_size=0",
                "max_batch_size must be at least 1, got 0",
            ),
            (
                "max_batch_size=100000",
                "max_batch_size must be at most 65536, got 100000",
            ),
            (
                "max_batch_size=5000000000",
                "max_batch_size must be at most 65536, got 5000000000",
            ),
            (
                "max_num_active_requests=0",
                "max_num_active_requests must be at least 1, got 0",
            ),
            ("tpot_budget=0", "tpot_budget must be in (0, 1]"),
            ("tpot_budget=1.5", "tpot_budget must be in (0, 1]"),
            ("tpot_budget=NaN", "tpot_budget must be in (0, 1]"),
            (
                "target_output_tps=0",
                "target_output_tps must be a finite rate above 0",
            ),
            (
                "target_output_tps=-3",
                "target_output_tps must be a finite rate above 0",
            ),
            (
                "target_output_tps=inf",
                "target_output_tps must be a finite rate above 0",
            ),
            (
                "tpot_budget=0.1+g0=0.2",
                "g0 must be a finite number in [0.25, 2], got 0.2",
            ),
            (
                "tpot_budget=0.1+g0=NaN",
                "g0 must be a finite number in [0.25, 2]",
            ),
        ] {
            let e = ArmSpec::parse(arm).unwrap_err();
            assert_eq!(e.arm, arm);
            assert!(e.why.starts_with(says), "{arm}: {}", e.why);
            assert!(
                e.to_string().starts_with(&format!("bad arm `{arm}`: ")),
                "{e}"
            );
        }
        assert_eq!(
            ArmSpec::parse("max_batch_size=65536")
                .unwrap()
                .max_batch_size,
            Some(65536)
        );
        assert_eq!(
            ArmSpec::parse("tpot_budget=1").unwrap().mode,
            ModeSpec::TpotBudget(1.0)
        );
    }

    #[test]
    fn g0_moves_where_the_window_gain_starts_within_its_clamps_and_only_with_tpot_budget() {
        let arm = ArmSpec::parse("tpot_budget=0.1+g0=0.25").unwrap();
        assert_eq!(arm.g0, Some(0.25));
        assert!(!arm.is_control());
        assert_eq!(ArmSpec::parse("tpot_budget=0.1").unwrap().g0, None);
        for bad in [
            "tpot_budget=0.1+g0=0.2",
            "tpot_budget=0.1+g0=2.5",
            "tpot_budget=0.1+g0=x",
        ] {
            assert!(ArmSpec::parse(bad).is_err(), "{bad}");
        }
        let e = ArmSpec::parse("target_output_tps=auto+g0=0.5").unwrap_err();
        assert!(e.why.contains("needs tpot_budget"), "{}", e.why);
        assert!(ArmSpec::parse("g0=0.5").is_err());
    }

    #[test]
    fn g_from_paused_holds_the_gain_and_needs_tpot_budget() {
        let arm = ArmSpec::parse("tpot_budget=0.1+g0=0.5+g_from=paused").unwrap();
        assert_eq!(arm.gain_from, Some(GainFrom::Paused));
        assert_eq!(arm.g0, Some(0.5));
        let any = ArmSpec::parse("tpot_budget=0.1+g_from=any").unwrap();
        assert_eq!(any.gain_from, Some(GainFrom::Any));
        let unset = ArmSpec::parse("tpot_budget=0.1").unwrap();
        assert_eq!(unset.gain_from, None, "the config's gain_from, else any");
        let e = ArmSpec::parse("tpot_budget=0.1+g_from=later").unwrap_err();
        assert!(e.why.contains("unknown g_from `later`"), "{}", e.why);
        let e = ArmSpec::parse("target_output_tps=auto+g_from=paused").unwrap_err();
        assert!(e.why.contains("g_from is about tpot_budget"), "{}", e.why);
    }

    #[test]
    fn pauses_moves_tpot_budgets_per_request_limit_within_its_range_and_only_with_tpot_budget() {
        let arm = ArmSpec::parse("tpot_budget=0.1+pauses=4").unwrap();
        assert_eq!(arm.pauses, Some(4));
        assert!(!arm.is_control());
        assert_eq!(
            ArmSpec::parse("tpot_budget=0.1").unwrap().pauses,
            None,
            "SPEC §4.3's 2"
        );
        assert_eq!(
            ArmSpec::parse("tpot_budget=0.1+pauses=16").unwrap().pauses,
            Some(16)
        );
        for bad in ["0", "17", "2.5", "-1", "x"] {
            let text = format!("tpot_budget=0.1+pauses={bad}");
            let e = ArmSpec::parse(&text).unwrap_err();
            assert_eq!(
                e.why,
                format!("pauses must be a whole number in [1, 16], got {bad}"),
                "{text}"
            );
        }
        let e = ArmSpec::parse("target_output_tps=auto+pauses=4").unwrap_err();
        assert!(
            e.why
                .contains("pauses is about tpot_budget's pauses per request"),
            "{}",
            e.why
        );
    }
}

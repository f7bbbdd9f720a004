//! Arms of a simulation: `control`, `tpot_budget=0.10`, `target_output_tps=auto`,
//! `max_batch_size=144`, and combinations joined by `+`
//! (e.g. `tpot_budget=0.10+order=edf`, `tpot_budget=0.10+victim=newest_resident`,
//! `tpot_budget=0.10+g0=0.25`: where the window gain g starts).

use serde::Serialize;

use crate::policy::names;
use crate::policy::preemption::controller::{G_MAX, G_MIN};
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
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("bad arm `{arm}`: {why} (examples: control, tpot_budget=0.10, target_output_tps=auto, max_batch_size=144, tpot_budget=0.1+order=edf, tpot_budget=0.1+victim=newest_resident, tpot_budget=0.1+g0=0.25)")]
pub struct ArmError {
    pub arm: String,
    pub why: String,
}

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
        for part in text.split('+').map(str::trim) {
            if part == "control" {
                continue;
            }
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err(format!("`{part}` is not key=value")))?;
            let num = |v: &str| {
                v.parse::<f64>()
                    .map_err(|_| err(format!("`{v}` is not a number")))
            };
            let int = |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| err(format!("`{v}` is not a whole number")))
            };
            match k {
                "tpot_budget" => {
                    let b = num(v)?;
                    if !(b > 0.0 && b <= 1.0) {
                        return Err(err("tpot_budget must be in (0, 1]".into()));
                    }
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
                        if t.is_nan() || t <= 0.0 {
                            return Err(err("target_output_tps must be > 0".into()));
                        }
                        ModeSpec::TargetOutputTps(Some(t))
                    };
                }
                "max_batch_size" => arm.max_batch_size = Some(int(v)?.max(1)),
                "max_num_active_requests" => arm.max_active = Some(int(v)?.max(1)),
                "order" => arm.order = Some(rule::<AdmissionPolicy>("order", v).map_err(err)?),
                "victim" => arm.victim = Some(rule::<VictimKey>("victim", v).map_err(err)?),
                "g0" => {
                    let g = num(v)?;
                    if !(G_MIN..=G_MAX).contains(&g) {
                        return Err(err(format!("g0 must be in [{G_MIN}, {G_MAX}]")));
                    }
                    arm.g0 = Some(g);
                }
                _ => return Err(err(format!("unknown key `{k}`"))),
            }
        }
        if arm.g0.is_some() && !matches!(arm.mode, ModeSpec::TpotBudget(_)) {
            return Err(err(
                "g0 is tpot_budget's window gain: it needs tpot_budget=".into(),
            ));
        }
        Ok(arm)
    }

    pub fn parse_list(text: &str) -> Result<Vec<Self>, ArmError> {
        text.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(Self::parse)
            .collect()
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
}

//! The rules a single value keeps, each as the text that follows the field's name when it
//! is broken ("must be at most 65536, got 100000"). The config's validation applies them to
//! its fields, and the simulator to the flags and arms that stand for the same settings, so
//! both refuse a value alike.

use super::validate::MAX_SECONDS;

/// A count in [1, max].
pub fn count(v: u64, max: u64) -> Result<(), String> {
    if v < 1 {
        Err(format!("must be at least 1, got {v}"))
    } else if v > max {
        Err(format!("must be at most {max}, got {v}"))
    } else {
        Ok(())
    }
}

/// A finite number in [min, max].
pub fn finite_within(v: f64, min: f64, max: f64) -> Result<(), String> {
    if v.is_finite() && v >= min && v <= max {
        Ok(())
    } else {
        Err(format!(
            "must be a finite number in [{min}, {max}], got {v}"
        ))
    }
}

/// A finite number above 0 (a scale factor).
pub fn above_zero(v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "must be a finite number above 0, got {}",
            number(v)
        ))
    }
}

/// A duration in seconds: finite, above 0, at most [`MAX_SECONDS`].
pub fn seconds(v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 && v <= MAX_SECONDS {
        Ok(())
    } else {
        Err(format!(
            "must be a number of seconds in (0, {MAX_SECONDS}], got {}",
            number(v)
        ))
    }
}

/// `tpot_budget`: a relative TPOT inflation in (0, 1].
pub fn tpot_budget(b: f64) -> Result<(), String> {
    if b.is_finite() && b > 0.0 && b <= 1.0 {
        Ok(())
    } else {
        Err(format!(
            "must be in (0, 1] (a relative TPOT inflation, 0.10 = 10%), got {}",
            number(b)
        ))
    }
}

/// `target_output_tps`: a finite rate above 0 tokens/s.
pub fn target_output_tps(t: f64) -> Result<(), String> {
    if t.is_finite() && t > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "must be a finite rate above 0 tokens/s, got {}",
            number(t)
        ))
    }
}

/// `v` as written by hand: plainly, or in exponent form where the plain form would run to
/// dozens of digits (1e300 rather than a 1 and 300 zeros).
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a.is_finite() && a != 0.0 && !(1e-6..1e16).contains(&a) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_names_its_bound_and_the_value_it_refused() {
        assert_eq!(count(0, 8).unwrap_err(), "must be at least 1, got 0");
        assert_eq!(count(9, 8).unwrap_err(), "must be at most 8, got 9");
        assert!(count(8, 8).is_ok());
        assert!(seconds(f64::INFINITY).unwrap_err().ends_with("got inf"));
        assert!(seconds(MAX_SECONDS).is_ok());
        assert!(finite_within(f64::NAN, 0.0, 1.0).is_err());
        assert!(tpot_budget(1.0).is_ok() && tpot_budget(0.0).is_err());
        assert!(target_output_tps(f64::INFINITY).is_err());
        assert_eq!(
            above_zero(0.0).unwrap_err(),
            "must be a finite number above 0, got 0"
        );
        assert!(above_zero(f64::NAN).is_err() && above_zero(0.5).is_ok());
        assert!(seconds(1e300).unwrap_err().ends_with("got 1e300"));
        assert!(seconds(-1e-300).unwrap_err().ends_with("got -1e-300"));
        assert!(seconds(-10.0).unwrap_err().ends_with("got -10"));
    }
}

//! The sampling parameters of a request (SPEC §7): `temperature`, `top_p`, `top_k`, `seed`
//! into [`SamplingParams`], and the `stop` strings. Out-of-range values are a 400 naming the
//! parameter.

use serde_json::Value;

use super::error::ApiError;
use super::fields::{shown, Fields};
use crate::sampling::SamplingParams;

/// OpenAI's defaults: a request that sets nothing samples at temperature 1 over the whole
/// distribution; greedy decoding is `temperature: 0`.
pub const DEFAULT_TEMPERATURE: f32 = 1.0;
/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

fn invalid(param: &'static str, message: String) -> ApiError {
    ApiError::invalid("invalid_value", Some(param), message)
}

pub fn sampling(f: &Fields) -> Result<SamplingParams, ApiError> {
    let temperature = match f.number("temperature")? {
        None => DEFAULT_TEMPERATURE,
        Some(t) if (0.0..=2.0).contains(&t) => t as f32,
        Some(t) => {
            return Err(invalid(
                "temperature",
                format!("`temperature` must be in [0, 2], got {t}"),
            ))
        }
    };
    let top_p = match f.number("top_p")? {
        None => 1.0,
        Some(p) if p > 0.0 && p <= 1.0 => p as f32,
        Some(p) => {
            return Err(invalid(
                "top_p",
                format!("`top_p` must be in (0, 1], got {p}"),
            ))
        }
    };
    let top_k = match f.int("top_k")? {
        // vLLM spells "off" as -1.
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        Some(k) => {
            return Err(invalid(
                "top_k",
                format!("`top_k` must be ≥ 0 (0 or -1 = off), got {k}"),
            ))
        }
    };
    let seed = match f.get("seed") {
        None => None,
        // Any 64-bit integer, signed (OpenAI, vLLM) or not; a negative one keeps its bits.
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|s| s as u64))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "invalid_type",
                        Some("seed"),
                        format!("`seed` must be an integer, got {}", shown(v)),
                    )
                })?,
        ),
    };
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        seed,
    })
}

/// `stop`: a string or a list of at most [`MAX_STOP_STRINGS`] non-empty strings.
pub fn stop_strings(f: &Fields) -> Result<Vec<String>, ApiError> {
    let bad = |what: String| ApiError::invalid("invalid_value", Some("stop"), what);
    let list = match f.get("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(bad(format!(
                    "`stop` must hold strings, got {}",
                    shown(other)
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                "invalid_type",
                Some("stop"),
                format!(
                    "`stop` must be a string or a list of strings, got {}",
                    shown(v)
                ),
            ))
        }
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(bad(format!(
            "`stop` holds at most {MAX_STOP_STRINGS} strings, got {}",
            list.len()
        )));
    }
    if list.iter().any(String::is_empty) {
        return Err(bad("`stop` strings must not be empty".into()));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<SamplingParams, ApiError> {
        sampling(&Fields::new(v.as_object().unwrap()))
    }

    fn stops(v: Value) -> Result<Vec<String>, ApiError> {
        stop_strings(&Fields::new(v.as_object().unwrap()))
    }

    #[test]
    fn absent_parameters_sample_at_temperature_one() {
        let p = parse(json!({})).unwrap();
        assert_eq!(
            (p.temperature, p.top_p, p.top_k, p.seed),
            (1.0, 1.0, 0, None)
        );
        assert!(parse(json!({"temperature": 0})).unwrap().is_greedy());
    }

    #[test]
    fn values_in_range_are_carried() {
        let p = parse(json!({"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": -3})).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.7, 0.9, 40));
        assert_eq!(p.seed, Some((-3i64) as u64));
        assert_eq!(parse(json!({"top_k": -1})).unwrap().top_k, 0);
        assert_eq!(
            parse(json!({"seed": u64::MAX})).unwrap().seed,
            Some(u64::MAX)
        );
    }

    #[test]
    fn out_of_range_or_mistyped_values_name_their_parameter() {
        for (body, param) in [
            (json!({"temperature": -1}), "temperature"),
            (json!({"temperature": 5}), "temperature"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"top_p": 7}), "top_p"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"top_k": -2}), "top_k"),
            (json!({"top_k": 1.5}), "top_k"),
            (json!({"seed": "abc"}), "seed"),
            (json!({"seed": 1.5}), "seed"),
        ] {
            assert_eq!(
                parse(body.clone()).unwrap_err().param(),
                Some(param),
                "{body}"
            );
        }
    }

    #[test]
    fn stop_is_a_string_or_up_to_four_non_empty_strings() {
        assert_eq!(stops(json!({})).unwrap(), Vec::<String>::new());
        assert_eq!(stops(json!({"stop": "\n"})).unwrap(), ["\n"]);
        assert_eq!(stops(json!({"stop": ["a", "b"]})).unwrap(), ["a", "b"]);
        assert_eq!(stops(json!({"stop": []})).unwrap(), Vec::<String>::new());
        for bad in [
            json!({"stop": 5}),
            json!({"stop": [1]}),
            json!({"stop": ""}),
            json!({"stop": ["a", ""]}),
            json!({"stop": ["a", "b", "c", "d", "e"]}),
        ] {
            assert_eq!(
                stops(bad.clone()).unwrap_err().param(),
                Some("stop"),
                "{bad}"
            );
        }
    }
}

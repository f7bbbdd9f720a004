//! Typed reads of a request body's JSON object, each error naming the parameter at fault.
//! `null` reads as absent, as OpenAI's API treats it.

use serde_json::{Map, Value};

use super::error::ApiError;

/// The top-level object of a request body.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
}

fn wrong_type(param: &'static str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        "invalid_type",
        Some(param),
        format!("`{param}` must be {want}, got {}", shown(got)),
    )
}

/// A value for an error message, cut short.
pub fn shown(v: &Value) -> String {
    let mut s = v.to_string();
    if s.chars().count() > 40 {
        s = s.chars().take(40).collect::<String>() + "…";
    }
    s
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Self {
        Fields { map }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The value of `name`, `None` when absent or null.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &'static str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(name, "true or false", v)),
        }
    }

    /// A JSON integer (`5`, not `5.0` or `"5"`).
    pub fn int(&self, name: &'static str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| wrong_type(name, "an integer", v)),
        }
    }

    /// Any JSON number.
    pub fn number(&self, name: &'static str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| wrong_type(name, "a number", v)),
        }
    }

    pub fn string(&self, name: &'static str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(name, "a string", v)),
        }
    }

    pub fn object(&self, name: &'static str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Fields::new(m))),
            Some(v) => Err(wrong_type(name, "an object", v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_are_checked_and_null_is_absent() {
        let v = json!({"a": 1, "b": 1.5, "c": "x", "d": null, "e": true, "f": {"g": 1}});
        let f = Fields::new(v.as_object().unwrap());
        assert_eq!(f.int("a").unwrap(), Some(1));
        assert_eq!(f.int("b").unwrap_err().param(), Some("b"));
        assert_eq!(f.number("a").unwrap(), Some(1.0));
        assert_eq!(f.string("c").unwrap(), Some("x"));
        assert_eq!(f.string("d").unwrap(), None);
        assert_eq!(f.bool("e").unwrap(), Some(true));
        assert_eq!(f.bool("c").unwrap_err().code, "invalid_type");
        assert_eq!(f.object("f").unwrap().unwrap().int("g").unwrap(), Some(1));
        assert_eq!(f.int("missing").unwrap(), None);
    }
}

//! The names of a rule enum (a pop order, a victim rule), read from the enum's own serde
//! attributes: every variant in declaration order, its name, and parsing a name (aliases
//! included). A new variant is therefore selectable, listed in error messages and covered by
//! the tests that run every rule, with no list kept anywhere else.

use serde::de::value::{Error as ValueError, StrDeserializer};
use serde::de::{Deserialize, DeserializeOwned, Deserializer, Error as _, Visitor};
use serde::Serialize;

/// Every variant of a unit-variant enum, in declaration order (each once, aliases folded).
pub fn all<T: DeserializeOwned + PartialEq>() -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for name in accepted_names::<T>() {
        if let Ok(v) = parse::<T>(name) {
            if !out.contains(&v) {
                out.push(v);
            }
        }
    }
    out
}

/// The variant's serde name (`guard_first`), as written in configs and arms.
pub fn name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        // Only unit variants serialize to a bare string; anything else has no single name.
        Ok(other) => other.to_string(),
        Err(e) => e.to_string(),
    }
}

/// Every variant's name, in declaration order, joined by ", " (for error messages).
pub fn listed<T: DeserializeOwned + PartialEq + Serialize>() -> String {
    all::<T>().iter().map(name).collect::<Vec<_>>().join(", ")
}

/// The variant named `text` (its name or an alias); the error lists the valid names.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, ValueError> {
    T::deserialize(StrDeserializer::<ValueError>::new(text))
}

/// The names the enum's derived `Deserialize` accepts (aliases included), as it hands them
/// to `deserialize_enum`.
fn accepted_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    // The capture always ends in an error, by design: only the names are wanted.
    let _ = T::deserialize(NameCapture(&mut names));
    names
}

/// A deserializer that only records the variant names an enum's `Deserialize` offers.
struct NameCapture<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for NameCapture<'_> {
    type Error = ValueError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(ValueError::custom("not an enum"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = variants;
        Err(ValueError::custom("names captured"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::preemption::victim::VictimKey;
    use crate::policy::AdmissionPolicy;

    #[test]
    fn every_variant_once_in_declaration_order_with_its_serde_name() {
        let orders = all::<AdmissionPolicy>();
        assert_eq!(orders[0], AdmissionPolicy::Auto);
        assert!(orders.contains(&AdmissionPolicy::GuardFirst));
        let names: Vec<String> = orders.iter().map(name).collect();
        assert_eq!(names[..2], ["auto", "guard_first"]);
        assert!(!names.iter().any(|n| n.contains('-')), "aliases are folded");
        assert_eq!(all::<VictimKey>()[0], VictimKey::LongestResident);
    }

    #[test]
    fn names_and_aliases_parse_and_an_unknown_name_is_refused_with_the_valid_ones() {
        assert_eq!(
            parse::<AdmissionPolicy>("guard-first").ok(),
            Some(AdmissionPolicy::GuardFirst)
        );
        assert_eq!(
            parse::<VictimKey>("newest_resident").ok(),
            Some(VictimKey::NewestResident)
        );
        assert!(parse::<AdmissionPolicy>("bogus").is_err());
        let listed = listed::<VictimKey>();
        assert!(
            listed.starts_with("longest_resident, newest_resident"),
            "{listed}"
        );
    }
}

//! The leaf values of data_parser v0.0.42 ([`Text`], [`NoVal`], [`States`]):
//! types that read whatever JSON value is in their place, so that a value of
//! another type than Slurm writes there reads as "none" (empty text, unset,
//! no flags) instead of failing the whole answer. The objects around them
//! (`jobs`, `steps`, `time`, ...) are derived structs in the parent module.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Any JSON value, kept only as far as a leaf needs it: a list keeps its
/// strings, an object its `set`, `infinite` and `number`.
#[derive(Clone, Debug, Default, PartialEq)]
enum Leaf {
    #[default]
    Null,
    Bool(bool),
    Int(i64),
    /// A number that is not an `i64` (as JSON writes it).
    OtherNumber(String),
    Str(String),
    List(Vec<String>),
    /// An object's `{"set", "infinite", "number"}`: `set` and `infinite`
    /// when `true`, `number` when an integer.
    Object {
        set: bool,
        infinite: bool,
        number: Option<i64>,
    },
}

impl<'de> Deserialize<'de> for Leaf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Leaf, D::Error> {
        d.deserialize_any(LeafVisitor)
    }
}

struct LeafVisitor;

impl<'de> Visitor<'de> for LeafVisitor {
    type Value = Leaf;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Leaf, E> {
        Ok(Leaf::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Leaf, E> {
        Ok(Leaf::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Leaf, E> {
        Ok(Leaf::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Leaf, E> {
        Ok(i64::try_from(v).map_or_else(|_| Leaf::OtherNumber(v.to_string()), Leaf::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Leaf, E> {
        Ok(Leaf::OtherNumber(serde_json::Number::from_f64(v).map(|n| n.to_string()).unwrap_or_default()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Leaf, E> {
        Ok(Leaf::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Leaf, E> {
        Ok(Leaf::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Leaf, A::Error> {
        let mut strings = Vec::new();
        while let Some(item) = seq.next_element::<Leaf>()? {
            if let Leaf::Str(s) = item {
                strings.push(s);
            }
        }
        Ok(Leaf::List(strings))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Leaf, A::Error> {
        let (mut set, mut infinite, mut number) = (false, false, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "set" => set = map.next_value::<Leaf>()? == Leaf::Bool(true),
                "infinite" => infinite = map.next_value::<Leaf>()? == Leaf::Bool(true),
                "number" => {
                    number = match map.next_value::<Leaf>()? {
                        Leaf::Int(n) => Some(n),
                        _ => None,
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Leaf::Object { set, infinite, number })
    }
}

/// A value shown as text: a string as it is, a number as JSON writes it, a
/// boolean as `1`/`0` (`batch_flag`); anything else is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "Leaf")]
pub(super) struct Text(pub String);

impl From<Leaf> for Text {
    fn from(v: Leaf) -> Text {
        Text(match v {
            Leaf::Str(s) | Leaf::OtherNumber(s) => s,
            Leaf::Int(n) => n.to_string(),
            Leaf::Bool(b) => if b { "1" } else { "0" }.to_owned(),
            Leaf::Null | Leaf::List(_) | Leaf::Object { .. } => String::new(),
        })
    }
}

impl Text {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, or `none` when it is empty (`(null)`, as `scontrol` shows it).
    pub fn or(&self, none: &str) -> String {
        if self.0.is_empty() { none.to_owned() } else { self.0.clone() }
    }
}

/// A `UINT32_NO_VAL`/`UINT64_NO_VAL` value: `{"set", "infinite", "number"}`,
/// or a plain number where Slurm writes one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "Leaf")]
pub(super) enum NoVal {
    #[default]
    Unset,
    Infinite,
    Number(i64),
}

impl From<Leaf> for NoVal {
    fn from(v: Leaf) -> NoVal {
        match v {
            Leaf::Int(n) => NoVal::Number(n),
            Leaf::Object { infinite: true, .. } => NoVal::Infinite,
            Leaf::Object { set: true, number: Some(n), .. } => NoVal::Number(n),
            _ => NoVal::Unset,
        }
    }
}

impl NoVal {
    /// The number, when it is set.
    pub fn number(self) -> Option<i64> {
        match self {
            NoVal::Number(n) => Some(n),
            _ => None,
        }
    }
}

/// A `JOB_STATE`: its flag names (the strings of the list).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "Leaf")]
pub(super) struct States(pub Vec<String>);

impl From<Leaf> for States {
    fn from(v: Leaf) -> States {
        match v {
            Leaf::List(flags) => States(flags),
            _ => States::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read<T: for<'de> Deserialize<'de> + Default>(json: &str) -> T {
        serde_json::from_str(json).unwrap_or_default()
    }

    #[test]
    fn no_vals() {
        assert_eq!(read::<NoVal>(r#"{"set":true,"infinite":false,"number":5}"#), NoVal::Number(5));
        assert_eq!(read::<NoVal>(r#"{"set":false,"infinite":true,"number":0}"#), NoVal::Infinite);
        assert_eq!(read::<NoVal>(r#"{"set":false,"infinite":false,"number":0}"#), NoVal::Unset);
        assert_eq!(read::<NoVal>(r#"{"set":true,"number":2.5}"#), NoVal::Unset);
        assert_eq!(read::<NoVal>(r#"{"set":"yes","number":2}"#), NoVal::Unset);
        assert_eq!(read::<NoVal>(r#"{"number":{"set":true},"set":true,"x":[1]}"#), NoVal::Unset);
        assert_eq!(read::<NoVal>("7"), NoVal::Number(7));
        assert_eq!(read::<NoVal>("18446744073709551615"), NoVal::Unset);
        assert_eq!(read::<NoVal>(r#""7""#), NoVal::Unset);
    }

    #[test]
    fn texts_and_states() {
        assert_eq!(read::<Text>(r#""a \"b\" c""#), Text("a \"b\" c".into()));
        assert_eq!(read::<Text>("12"), Text("12".into()));
        assert_eq!(read::<Text>("1.5"), Text("1.5".into()));
        assert_eq!(read::<Text>("true"), Text("1".into()));
        assert_eq!(read::<Text>("null"), Text::default());
        assert_eq!(read::<Text>(r#"{"job_state":"RUNNING"}"#), Text::default());
        assert_eq!(read::<Text>(r#"["x"]"#), Text::default());
        assert_eq!(read::<States>(r#"["RUNNING",3,null,"COMPLETING",["X"]]"#).0, ["RUNNING", "COMPLETING"]);
        assert_eq!(read::<States>(r#""RUNNING""#), States::default());
    }
}

//! JSON that keeps its keys in the order they came in.
//!
//! ADK writes an eval set with pydantic, which keeps a model's fields in their declared order
//! and a dict's keys in insertion order. `serde_json::Value` sorts keys, so a file read into
//! it and written out again is not the file it was. [`Doc`] is the JSON of eval sets and
//! cases, stored as text and exported byte for byte.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Number;
use std::fmt;

/// A JSON value whose objects keep their keys' order. A key given twice keeps its first
/// place and its last value, as Python's `json` reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Doc {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Doc>),
    Object(Vec<(String, Doc)>),
}

impl Doc {
    pub fn object() -> Doc {
        Doc::Object(Vec::new())
    }

    pub fn str(s: impl Into<String>) -> Doc {
        Doc::String(s.into())
    }

    /// A float as Python writes it: `0.0`, never `0`.
    pub fn float(f: f64) -> Doc {
        Number::from_f64(f).map_or(Doc::Null, Doc::Number)
    }

    pub fn get(&self, key: &str) -> Option<&Doc> {
        match self {
            Doc::Object(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Doc::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Vec<Doc>> {
        match self {
            Doc::Array(items) => Some(items),
            _ => None,
        }
    }

    /// Sets `key`, in its place if it is there, else at the end. No-op on a non-object.
    pub fn set(&mut self, key: &str, value: Doc) {
        if let Doc::Object(pairs) = self {
            match pairs.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) => *v = value,
                None => pairs.push((key.to_string(), value)),
            }
        }
    }

    /// Builder form of [`Doc::set`].
    pub fn with(mut self, key: &str, value: Doc) -> Doc {
        self.set(key, value);
        self
    }

    pub fn remove(&mut self, key: &str) -> Option<Doc> {
        match self {
            Doc::Object(pairs) => {
                let i = pairs.iter().position(|(k, _)| k == key)?;
                Some(pairs.remove(i).1)
            }
            _ => None,
        }
    }

    /// Whether this is `null`, `false`, `0`, `""`, `[]` or `{}`: Python's falsy values.
    pub fn is_falsy(&self) -> bool {
        match self {
            Doc::Null => true,
            Doc::Bool(b) => !b,
            Doc::Number(n) => n.as_f64() == Some(0.0),
            Doc::String(s) => s.is_empty(),
            Doc::Array(a) => a.is_empty(),
            Doc::Object(o) => o.is_empty(),
        }
    }

    /// Pretty JSON with two-space indents: what pydantic's `model_dump_json(indent=2)` writes.
    pub fn to_pretty(&self) -> String {
        // Serializing a `Doc` cannot fail: every key is a string, every number finite.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn to_compact(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads JSON text, keeping key order.
    pub fn parse(text: &str) -> serde_json::Result<Doc> {
        serde_json::from_str(text)
    }
}

/// A `serde_json::Value` (its keys sorted) as a [`Doc`].
impl From<serde_json::Value> for Doc {
    fn from(v: serde_json::Value) -> Doc {
        match v {
            serde_json::Value::Null => Doc::Null,
            serde_json::Value::Bool(b) => Doc::Bool(b),
            serde_json::Value::Number(n) => Doc::Number(n),
            serde_json::Value::String(s) => Doc::String(s),
            serde_json::Value::Array(a) => Doc::Array(a.into_iter().map(Doc::from).collect()),
            serde_json::Value::Object(o) => {
                Doc::Object(o.into_iter().map(|(k, v)| (k, Doc::from(v))).collect())
            }
        }
    }
}

impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Doc::Null => s.serialize_unit(),
            Doc::Bool(b) => s.serialize_bool(*b),
            Doc::Number(n) => n.serialize(s),
            Doc::String(v) => s.serialize_str(v),
            Doc::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Doc::Object(pairs) => {
                let mut map = s.serialize_map(Some(pairs.len()))?;
                for (k, v) in pairs {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Doc, D::Error> {
        d.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Doc, E> {
        Ok(Doc::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Doc, E> {
        Ok(Doc::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Doc, E> {
        Ok(Doc::Number(n.into()))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Doc, E> {
        Ok(Doc::float(f))
    }

    fn visit_str<E>(self, s: &str) -> Result<Doc, E> {
        Ok(Doc::String(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Doc, E> {
        Ok(Doc::String(s))
    }

    fn visit_unit<E>(self) -> Result<Doc, E> {
        Ok(Doc::Null)
    }

    fn visit_none<E>(self) -> Result<Doc, E> {
        Ok(Doc::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Doc::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        // Each key's place, so that a body of many keys costs one pass, not one per key.
        let mut places: std::collections::HashMap<String, usize> = Default::default();
        let mut pairs: Vec<(String, Doc)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Doc>()? {
            match places.get(&k) {
                Some(&i) => pairs[i].1 = v,
                None => {
                    places.insert(k.clone(), pairs.len());
                    pairs.push((k, v));
                }
            }
        }
        Ok(Doc::Object(pairs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order_and_pretty_matches_pydantic() {
        let text = "{\n  \"b\": 1,\n  \"a\": [\n    1.5,\n    {}\n  ],\n  \"c\": []\n}";
        let doc = Doc::parse(text).unwrap();
        assert_eq!(doc.to_pretty(), text);
        assert_eq!(doc.to_compact(), r#"{"b":1,"a":[1.5,{}],"c":[]}"#);
    }

    #[test]
    fn a_repeated_key_keeps_its_first_place_and_last_value() {
        let doc = Doc::parse(r#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(doc.to_compact(), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn an_object_of_many_keys_is_read_in_one_pass() {
        // 200,000 keys: one lookup each would be 2·10¹⁰ comparisons; this takes milliseconds.
        let text = format!(
            "{{{}}}",
            (0..200_000)
                .map(|i| format!("\"k{i}\":{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let doc = Doc::parse(&text).unwrap();
        assert_eq!(
            doc.get("k199999").map(Doc::to_compact).as_deref(),
            Some("199999")
        );
    }

    #[test]
    fn floats_are_written_as_python_writes_them() {
        assert_eq!(Doc::float(0.0).to_compact(), "0.0");
        // Python's repr: the shortest text that reads back as the same float.
        assert_eq!(
            Doc::float(1764669123.456789).to_compact(),
            "1764669123.456789"
        );
        assert_eq!(Doc::float(0.1 + 0.2).to_compact(), "0.30000000000000004");
    }
}

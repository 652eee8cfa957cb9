//! JSON schemas reduced to the OpenAPI 3.0 subset Gemini's `parameters` accept.

use crate::event::JsonMap;
use serde_json::{json, Map, Value};

/// How deep `$ref`s are inlined before a (recursive) reference is cut off.
const MAX_REF_DEPTH: usize = 6;

/// Reduces a JSON schema to the OpenAPI 3.0 subset Gemini's `Schema` accepts, best-effort:
///
/// - kept: `type` (upper-cased), `format` (only the ones Gemini knows: `enum` and
///   `date-time` for strings, `int32` / `int64` / `float` / `double` for numbers),
///   `title`, `description`, `nullable`, `enum` (strings only), `properties`, `required`
///   (only names that are properties), `items`, `anyOf`, `minItems` / `maxItems`,
///   `minProperties` / `maxProperties`, `minLength` / `maxLength`, `pattern`, `minimum` /
///   `maximum`, `default`, `example`, `propertyOrdering`;
/// - rewritten: local `$ref`s (`#/$defs/…`, `#/definitions/…`) are inlined (a recursive
///   reference becomes a plain `OBJECT` after a few levels); `type: [T, "null"]` becomes
///   `type: T, nullable: true`; a `null` branch of `anyOf`/`oneOf` becomes `nullable`;
///   `oneOf` becomes `anyOf`; a single-branch `anyOf` is inlined; `const` becomes a
///   one-value `enum`; `allOf` branches are merged into the schema;
/// - dropped: everything else (`$schema`, `$id`, `$defs`, `additionalProperties`,
///   `patternProperties`, `exclusiveMinimum`, `examples`, `not`, `if`/`then`, …).
pub fn gemini_schema(schema: &Value) -> Value {
    let defs = Defs {
        defs: schema.get("$defs").and_then(Value::as_object),
        definitions: schema.get("definitions").and_then(Value::as_object),
    };
    convert(schema, &defs, 0)
}

struct Defs<'a> {
    defs: Option<&'a JsonMap>,
    definitions: Option<&'a JsonMap>,
}

impl Defs<'_> {
    fn resolve(&self, reference: &str) -> Option<&Value> {
        if let Some(name) = reference.strip_prefix("#/$defs/") {
            return self.defs?.get(name);
        }
        if let Some(name) = reference.strip_prefix("#/definitions/") {
            return self.definitions?.get(name);
        }
        None
    }
}

fn convert(schema: &Value, defs: &Defs, depth: usize) -> Value {
    let Some(src) = schema.as_object() else {
        // `true` / `{}`-like schemas: anything goes, which Gemini cannot say; leave it open.
        return json!({});
    };
    if let Some(r) = src.get("$ref").and_then(Value::as_str) {
        return inline_ref(src, r, defs, depth);
    }
    let mut src = src.clone();
    if let Some(Value::Array(branches)) = src.remove("allOf") {
        merge_all_of(&mut src, &branches, defs);
    }
    let mut out = Map::new();
    let (ty, mut nullable) = type_of(&src);
    // anyOf / oneOf, with a null branch folded into `nullable`.
    let alternatives = src
        .get("anyOf")
        .or_else(|| src.get("oneOf"))
        .and_then(Value::as_array);
    if let Some(alts) = alternatives {
        nullable |= alternatives_into(&mut out, alts, defs, depth);
    }
    if let Some(t) = &ty {
        out.insert("type".into(), t.to_ascii_uppercase().into());
    }
    // Formats are judged by the type the schema declared, before keywords add one.
    let ty = out
        .get("type")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_default();
    for (k, v) in &src {
        keyword_into(&mut out, &ty, k, v, defs, depth);
    }
    if let Some(req) = src.get("required").and_then(Value::as_array) {
        required_into(&mut out, req);
    }
    if !out.contains_key("type") && out.contains_key("properties") {
        out.insert("type".into(), "OBJECT".into());
    }
    if nullable {
        out.insert("nullable".into(), true.into());
    }
    Value::Object(out)
}

/// A reference, inlined; siblings of `$ref` (descriptions, mostly) override the target's.
fn inline_ref(src: &JsonMap, reference: &str, defs: &Defs, depth: usize) -> Value {
    let mut merged = match defs.resolve(reference) {
        Some(target) if depth < MAX_REF_DEPTH => convert(target, defs, depth + 1)
            .as_object()
            .cloned()
            .unwrap_or_default(),
        _ => json!({"type": "OBJECT"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    let mut rest = src.clone();
    rest.remove("$ref");
    if let Value::Object(extra) = convert(&Value::Object(rest), defs, depth) {
        merged.extend(extra);
    }
    Value::Object(merged)
}

/// `allOf`: the branches merged into the schema itself (properties and required lists joined,
/// other keywords the schema lacks taken over).
fn merge_all_of(src: &mut JsonMap, branches: &[Value], defs: &Defs) {
    for b in branches {
        let b = match b
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| defs.resolve(r))
        {
            Some(target) => target,
            None => b,
        };
        let Some(b) = b.as_object() else { continue };
        for (k, v) in b {
            match (k.as_str(), src.get_mut(k)) {
                ("properties", Some(Value::Object(props))) => {
                    if let Some(more) = v.as_object() {
                        props.extend(more.clone());
                    }
                }
                ("required", Some(Value::Array(req))) => {
                    if let Some(more) = v.as_array() {
                        req.extend(more.iter().cloned());
                    }
                }
                (_, Some(_)) => {}
                (_, None) => {
                    src.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// The schema's type (`"string"` or `["string", "null"]`) and whether it admits `null`.
fn type_of(src: &JsonMap) -> (Option<String>, bool) {
    let mut nullable = src.get("nullable").and_then(Value::as_bool) == Some(true);
    let ty = match src.get("type") {
        Some(Value::String(t)) => Some(t.clone()),
        Some(Value::Array(ts)) => {
            let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            nullable |= names.contains(&"null");
            names.into_iter().find(|t| *t != "null").map(str::to_string)
        }
        _ => None,
    };
    if ty.as_deref() == Some("null") {
        return (None, true);
    }
    (ty, nullable)
}

/// `anyOf`/`oneOf` into `out` (one branch inlined, several as `anyOf`); true if a branch was
/// `null`.
fn alternatives_into(out: &mut JsonMap, alts: &[Value], defs: &Defs, depth: usize) -> bool {
    let mut nullable = false;
    let mut branches = vec![];
    for a in alts {
        if a.get("type").and_then(Value::as_str) == Some("null") {
            nullable = true;
        } else {
            branches.push(convert(a, defs, depth));
        }
    }
    if branches.len() == 1 {
        if let Value::Object(only) = branches.remove(0) {
            out.extend(only);
        }
    } else if !branches.is_empty() {
        out.insert("anyOf".into(), branches.into());
    }
    nullable
}

/// One keyword of the source schema into `out`, if Gemini takes it (see [`gemini_schema`]).
fn keyword_into(out: &mut JsonMap, ty: &str, k: &str, v: &Value, defs: &Defs, depth: usize) {
    match k {
        "title" | "description" | "pattern" | "default" | "example" | "propertyOrdering"
        | "minItems" | "maxItems" | "minProperties" | "maxProperties" | "minLength"
        | "maxLength" | "minimum" | "maximum" => {
            out.insert(k.into(), v.clone());
        }
        "format" => {
            let known = match ty {
                "STRING" => ["enum", "date-time"].contains(&v.as_str().unwrap_or("")),
                "NUMBER" | "INTEGER" => {
                    ["int32", "int64", "float", "double"].contains(&v.as_str().unwrap_or(""))
                }
                _ => false,
            };
            if known {
                out.insert(k.into(), v.clone());
            }
        }
        "enum" => {
            if let Some(vals) = v.as_array().filter(|a| a.iter().all(Value::is_string)) {
                out.insert("enum".into(), vals.clone().into());
                out.entry("type").or_insert_with(|| "STRING".into());
            }
        }
        "const" if v.is_string() => {
            out.insert("enum".into(), json!([v]));
            out.entry("type").or_insert_with(|| "STRING".into());
        }
        "items" => {
            out.insert("items".into(), convert(v, defs, depth));
        }
        "properties" => {
            if let Some(props) = v.as_object() {
                let props: Map<String, Value> = props
                    .iter()
                    .map(|(name, s)| (name.clone(), convert(s, defs, depth)))
                    .collect();
                out.insert("properties".into(), props.into());
            }
        }
        _ => {}
    }
}

/// `required`, keeping only names that are properties, each once.
fn required_into(out: &mut JsonMap, req: &[Value]) {
    let props = out.get("properties").and_then(Value::as_object);
    let mut seen = std::collections::BTreeSet::new();
    let req: Vec<Value> = req
        .iter()
        .filter_map(Value::as_str)
        .filter(|name| props.is_some_and(|p| p.contains_key(*name)))
        .filter(|name| seen.insert(name.to_string()))
        .map(Value::from)
        .collect();
    if !req.is_empty() {
        out.insert("required".into(), req.into());
    }
}

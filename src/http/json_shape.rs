//! How many JSON values a body may hold, counted before it is parsed.
//!
//! A body's size says little about what parsing it costs: 32 MiB of one-letter parts
//! (`{"text":"a"},` is 13 bytes) is millions of parts, and each becomes a map or a struct of
//! hundreds of bytes, so one request could take gigabytes. Every intake (the ADK routes, the
//! frontends, A2A, MCP) counts the values of a body in one pass over its bytes, allocating
//! nothing, and refuses it (413 `body_too_complex`) before any parse.

use super::error::ApiError;
use crate::error_code::ErrorCode;

/// The values one request body may hold (`--max-json-values`), put in every request's
/// extensions by the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    pub max_values: usize,
}

impl Default for JsonLimits {
    fn default() -> Self {
        JsonLimits {
            max_values: crate::config::DEFAULT_MAX_JSON_VALUES,
        }
    }
}

impl JsonLimits {
    /// The limits a request carries (the defaults for one built without the router).
    pub fn of(extensions: &axum::http::Extensions) -> JsonLimits {
        extensions.get::<JsonLimits>().copied().unwrap_or_default()
    }

    /// Refuses `bytes` if they hold more than `max_values` JSON values.
    pub fn check(&self, bytes: &[u8]) -> Result<(), ApiError> {
        match count_values(bytes, self.max_values) {
            Some(_) => Ok(()),
            None => Err(ApiError::new(
                ErrorCode::BodyTooComplex,
                format!(
                    "The body holds more than {} JSON values (--max-json-values).",
                    self.max_values
                ),
            )),
        }
    }
}

/// The number of JSON values in `bytes` (objects, arrays, strings, numbers, literals), or
/// `None` as soon as there are more than `max`. Not a validator: malformed JSON is counted
/// as far as it goes and left to the parser to refuse. Object keys are not values.
pub fn count_values(bytes: &[u8], max: usize) -> Option<usize> {
    let mut count = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // Inside a number or a literal (`true`, `false`, `null`): counted at its first byte.
    let mut in_scalar = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                // A key (a string followed by `:`) is not a value.
                if !is_key(bytes, i + 1) {
                    count += 1;
                }
            }
        } else {
            match b {
                b'"' => {
                    in_string = true;
                    in_scalar = false;
                }
                b'{' | b'[' => {
                    in_scalar = false;
                    count += 1;
                }
                b'}' | b']' | b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => in_scalar = false,
                _ => {
                    if !in_scalar {
                        in_scalar = true;
                        count += 1;
                    }
                }
            }
        }
        if count > max {
            return None;
        }
        i += 1;
    }
    Some(count)
}

/// Whether the first non-blank byte from `at` is `:` (the string before it was a key).
fn is_key(bytes: &[u8], at: usize) -> bool {
    bytes[at.min(bytes.len())..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        == Some(&b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_not_keys_nor_what_strings_hold() {
        assert_eq!(count_values(b"{}", 10), Some(1));
        assert_eq!(
            count_values(br#"{"a": 1, "b": [true, null, "x"]}"#, 10),
            Some(6)
        );
        // Brackets, commas, colons and escaped quotes inside strings are text.
        assert_eq!(count_values(br#"["[{,:}]", "a\"b,", "\\"]"#, 10), Some(4));
        assert_eq!(count_values(br#"{"k" : "v"}"#, 10), Some(2));
        assert_eq!(count_values(b"-12.5e3", 10), Some(1));
        assert_eq!(count_values(b"  ", 10), Some(0));
    }

    #[test]
    fn stops_at_the_first_value_over_the_limit() {
        let parts: String = std::iter::repeat_n(r#"{"text":"a"},"#, 1000).collect();
        let body = format!(r#"{{"parts":[{}{{"text":"a"}}]}}"#, parts);
        // The object, the array, 1001 parts of one string each.
        assert_eq!(count_values(body.as_bytes(), 10_000), Some(2 + 2 * 1001));
        assert_eq!(count_values(body.as_bytes(), 2003), None);
        assert!(JsonLimits { max_values: 2003 }
            .check(body.as_bytes())
            .is_err());
        assert!(JsonLimits { max_values: 2004 }
            .check(body.as_bytes())
            .is_ok());
    }
}

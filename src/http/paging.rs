//! Page sizes: one rule for every list that pages by `limit`.

use super::error::{problem, ApiError, ApiResult};
use serde_json::json;

/// `limit` as asked (`default` without one): 1 to `max`, else 422 naming the bounds. A list
/// reads one more than this to learn whether a next page exists, so the last page never
/// carries a `next` that leads to an empty one.
pub fn limit(asked: Option<u32>, default: u32, max: u32) -> ApiResult<u32> {
    match asked {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::validation(vec![problem(
            if n == 0 {
                "greater_than_equal"
            } else {
                "less_than_equal"
            },
            vec![json!("query"), json!("limit")],
            format!("limit must be 1 to {max}, got {n}"),
        )])),
    }
}

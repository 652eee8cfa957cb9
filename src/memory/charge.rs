//! Embedding calls charged to the users they were made for, so `GET …/usage` and budgets
//! count memory's model calls as they count a run's (docs/memory.md#bounds).
//!
//! A query's embedding belongs to the user who searched: inside a run (the `load_memory`
//! tools) the run counts it with its own calls; outside one (`GET …/memory`, an extraction's
//! look at the user's memories) it is added to the user's usage as an [`OutsideCall`]. The
//! background embedder embeds many users' memories in one provider call, which reports one
//! total: each user is charged the share of it their texts made up ([`shares`]).
//!
//! And as a run is refused, memory's own calls for a user are not made while the user's or
//! the app's budget is spent ([`crate::store::usage::spent_budget`]): an extraction answers 429, a search outside a
//! run ranks by words alone, and the embedder puts the user's memories off until the budget
//! resets.

use crate::store::usage::OutsideCall;
use crate::store::UsageStore;
use crate::usage::{Prices, Tokens, Window};
use std::collections::BTreeMap;

/// Who pays for a search's query embedding.
#[derive(Clone, Copy)]
pub enum Charge<'a> {
    /// The user, at these prices: a search outside any run.
    User(&'a Prices),
    /// The run the search is part of: it is handed the model and its tokens.
    Run(&'a (dyn Fn(&str, Tokens) + Send + Sync)),
}

/// Embedding `tokens` of `model` for `user`: input tokens, no output.
fn tokens(input: u64) -> Tokens {
    Tokens::normalise(input, 0, 0, 0, input)
}

impl Charge<'_> {
    /// Charges one query embedding of `user` in `app`. A failed write is logged: the search
    /// goes on.
    pub async fn query(&self, store: &dyn UsageStore, app: &str, user: &str, model: &str, n: u64) {
        if n == 0 {
            return;
        }
        match self {
            Charge::Run(count) => count(model, tokens(n)),
            Charge::User(prices) => user_call(store, prices, app, user, model, n).await,
        }
    }
}

/// Adds `n` input tokens of `model` (and their cost) to `user`'s usage in `app` today.
pub async fn user_call(
    store: &dyn UsageStore,
    prices: &Prices,
    app: &str,
    user: &str,
    model: &str,
    n: u64,
) {
    let call = OutsideCall {
        app,
        user,
        model,
        day: Window::now().today,
        input_tokens: n,
        output_tokens: 0,
        cost: prices.cost(model, tokens(n)),
    };
    if let Err(e) = store.charge_call(&call).await {
        tracing::warn!(app, user, error = %e, "could not add an embedding call's tokens to the user's usage");
    }
}

/// `total` tokens split between the users whose texts (`(user, bytes)`, one per text) one
/// call embedded, in proportion to their bytes: whole tokens, largest remainders first, so
/// the shares add up to `total` exactly. Users in name order; none with a zero share.
pub fn shares<'a>(
    total: u64,
    texts: impl IntoIterator<Item = (&'a str, usize)>,
) -> Vec<(String, u64)> {
    let mut bytes: BTreeMap<&str, u64> = BTreeMap::new();
    for (user, n) in texts {
        *bytes.entry(user).or_default() += n.max(1) as u64;
    }
    let all: u64 = bytes.values().sum();
    if all == 0 || total == 0 {
        return vec![];
    }
    let mut out: Vec<(String, u64, u128)> = bytes
        .iter()
        .map(|(user, b)| {
            let exact = total as u128 * *b as u128;
            let whole = (exact / all as u128) as u64;
            (user.to_string(), whole, exact % all as u128)
        })
        .collect();
    let mut left = total - out.iter().map(|s| s.1).sum::<u64>();
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|a, b| out[*b].2.cmp(&out[*a].2).then(a.cmp(b)));
    for i in order {
        if left == 0 {
            break;
        }
        out[i].1 += 1;
        left -= 1;
    }
    out.into_iter()
        .filter(|s| s.1 > 0)
        .map(|(user, n, _)| (user, n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_texts_and_add_up() {
        let s = shares(100, [("b", 30), ("a", 10), ("b", 30), ("c", 30)]);
        assert_eq!(s, [("a".into(), 10), ("b".into(), 60), ("c".into(), 30)]);
        // 10 tokens over three equal users: 4, 3, 3 (the first remainder wins the tie).
        let s = shares(10, [("x", 5), ("y", 5), ("z", 5)]);
        assert_eq!(s.iter().map(|s| s.1).sum::<u64>(), 10);
        assert_eq!(s[0], ("x".into(), 4));
        // One user takes all; no tokens, no shares.
        assert_eq!(shares(7, [("u", 0)]), [("u".into(), 7)]);
        assert!(shares(0, [("u", 9)]).is_empty());
        assert!(shares(5, []).is_empty());
        // A user whose share rounds to nothing is left out.
        let s = shares(1, [("big", 1000), ("small", 1)]);
        assert_eq!(s, [("big".into(), 1)]);
    }
}

//! What a run spends, in the run's own vocabulary: token counts per model, their cost under
//! the operator's prices, and the budgets that bound what a user, an app or an API key
//! spends (docs/usage.md).
//!
//! It sits below every layer: the model adapters produce [`Tokens`], the outbox sums them
//! into a [`RunUsage`] that every commit of the run carries to the database, the store keeps
//! the daily aggregates, and the HTTP routes report them.

mod budget;
mod prices;

pub use budget::{
    date_day, day_date, iso_time, Budget, ChargedKey, Exhausted, Limit, Payer, Spent, Window,
    DAY_SECS,
};
pub use prices::{Price, Prices, PricesError};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One model response's token counts, normalised across providers: `output` counts every
/// generated token (reasoning included), `reasoning` is the part of it spent thinking,
/// `cached` the part of `input` read from the provider's prompt cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cached: u64,
    pub reasoning: u64,
}

impl Tokens {
    /// The counts in ADK's `usageMetadata` names, normalised: the output is every token past
    /// the prompt, so Gemini's thoughts (outside its candidates) and OpenAI's reasoning
    /// (inside its completion) count once either way.
    pub fn normalise(
        prompt: u64,
        candidates: u64,
        thoughts: u64,
        cached: u64,
        total: u64,
    ) -> Tokens {
        Tokens {
            input: prompt,
            output: total.saturating_sub(prompt).max(candidates),
            cached,
            reasoning: thoughts,
        }
    }

    /// An event's `usageMetadata`, as stored (what the protocol mappings report).
    pub fn of_metadata(u: &serde_json::Value) -> Tokens {
        let n = |k: &str| u.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let (prompt, candidates, thoughts) = (
            n("promptTokenCount"),
            n("candidatesTokenCount"),
            n("thoughtsTokenCount"),
        );
        let total = u
            .get("totalTokenCount")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(prompt + candidates + thoughts);
        Self::normalise(
            prompt,
            candidates,
            thoughts,
            n("cachedContentTokenCount"),
            total,
        )
    }

    pub fn add(&mut self, other: Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cached = self.cached.saturating_add(other.cached);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
    }

    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// One model's share of a run: its calls' tokens and what they cost (`cost` is `None` once a
/// call had no price: a cost is never guessed; `pricedCost` and `unpricedCalls` keep the
/// known part apart, which is what a cost budget counts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelUsage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
    #[serde(default)]
    pub model_calls: u64,
    #[serde(default)]
    pub cost: Option<f64>,
    /// The cost of the calls that had a price.
    #[serde(default)]
    pub priced_cost: f64,
    /// Calls whose model had no price.
    #[serde(default)]
    pub unpriced_calls: u64,
}

impl ModelUsage {
    fn add(&mut self, other: &ModelUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.model_calls = self.model_calls.saturating_add(other.model_calls);
        self.priced_cost += other.priced_cost;
        self.unpriced_calls = self.unpriced_calls.saturating_add(other.unpriced_calls);
        // Unknown as soon as one call's is.
        self.cost = (self.unpriced_calls == 0).then_some(self.priced_cost);
    }
}

/// A run's usage by model (the configured model name, which prices are keyed by). Stored as
/// this map's JSON on the run's record and carried by every commit of the run, so that a
/// replica that takes the run over goes on counting from what was committed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunUsage(pub BTreeMap<String, ModelUsage>);

impl RunUsage {
    /// Counts one model call's tokens, priced by `prices`.
    pub fn record(&mut self, model: &str, tokens: Tokens, prices: &Prices) {
        let cost = prices.cost(model, tokens);
        let call = ModelUsage {
            input_tokens: tokens.input,
            output_tokens: tokens.output,
            cached_tokens: tokens.cached.min(tokens.input),
            reasoning_tokens: tokens.reasoning,
            model_calls: 1,
            cost,
            priced_cost: cost.unwrap_or(0.0),
            unpriced_calls: u64::from(cost.is_none()),
        };
        self.0.entry(model.to_string()).or_default().add(&call);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The run's totals over every model.
    pub fn totals(&self) -> UsageTotals {
        let mut sum = ModelUsage::default();
        let mut priced = true;
        for m in self.0.values() {
            sum.input_tokens = sum.input_tokens.saturating_add(m.input_tokens);
            sum.output_tokens = sum.output_tokens.saturating_add(m.output_tokens);
            sum.cached_tokens = sum.cached_tokens.saturating_add(m.cached_tokens);
            sum.reasoning_tokens = sum.reasoning_tokens.saturating_add(m.reasoning_tokens);
            sum.model_calls = sum.model_calls.saturating_add(m.model_calls);
            match m.cost {
                Some(c) => sum.cost = Some(sum.cost.unwrap_or(0.0) + c),
                None => priced = false,
            }
        }
        UsageTotals {
            input_tokens: sum.input_tokens,
            output_tokens: sum.output_tokens,
            cached_tokens: sum.cached_tokens,
            reasoning_tokens: sum.reasoning_tokens,
            model_calls: sum.model_calls,
            cost: if priced { sum.cost.or(Some(0.0)) } else { None },
        }
    }

    /// What `self` holds beyond `before` (a snapshot of the same run taken earlier): the
    /// spending a budget check must add to what the database has seen.
    pub fn beyond(&self, before: &RunUsage) -> (u64, f64) {
        let now = self.totals();
        let then = before.totals();
        (
            (now.input_tokens + now.output_tokens)
                .saturating_sub(then.input_tokens + then.output_tokens),
            (self.priced_cost() - before.priced_cost()).max(0.0),
        )
    }

    /// The cost of the priced models (what counts against a cost budget).
    pub fn priced_cost(&self) -> f64 {
        self.0.values().map(|m| m.priced_cost).sum()
    }
}

/// A run's usage as the API shows it (`GET /runs/{id}`, the run listings).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `inputTokens` read from the provider's prompt cache.
    pub cached_tokens: u64,
    /// The part of `outputTokens` spent reasoning.
    pub reasoning_tokens: u64,
    pub model_calls: u64,
    /// Under the server's `--prices`; `null` when a model used has no price.
    pub cost: Option<f64>,
}

/// A run's usage as the API shows it: the totals, and the same counts by model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunUsageView {
    #[serde(flatten)]
    pub totals: UsageTotals,
    pub by_model: BTreeMap<String, ModelUsage>,
}

/// Serializes a run record's usage as [`RunUsageView`] (zeros for a run that called no
/// model).
pub fn serialize_run_usage<S: serde::Serializer>(
    usage: &Option<RunUsage>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let usage = usage.clone().unwrap_or_default();
    RunUsageView {
        totals: usage.totals(),
        by_model: usage.0,
    }
    .serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices() -> Prices {
        Prices::parse(
            "currency: USD\nmodels:\n  priced: {input: 1.0, output: 2.0, cached_input: 0.5}\n",
        )
        .unwrap()
    }

    #[test]
    fn a_run_sums_its_calls_per_model_and_prices_each() {
        let p = prices();
        let mut u = RunUsage::default();
        let t = Tokens {
            input: 1_000_000,
            output: 500_000,
            cached: 200_000,
            reasoning: 100,
        };
        u.record("priced", t, &p);
        u.record("priced", t, &p);
        let m = &u.0["priced"];
        assert_eq!(
            (m.input_tokens, m.output_tokens, m.model_calls),
            (2_000_000, 1_000_000, 2)
        );
        // (0.8M fresh × 1.0 + 0.2M cached × 0.5 + 0.5M out × 2.0) per call.
        assert_eq!(m.cost, Some(3.8));
        assert_eq!(u.totals().cost, Some(3.8));
        u.record("unpriced", t, &p);
        assert_eq!(u.0["unpriced"].cost, None);
        assert_eq!(
            u.totals().cost,
            None,
            "an unpriced model makes the total unknown"
        );
        assert_eq!(u.totals().model_calls, 3);
    }

    #[test]
    fn the_stored_form_reads_back() {
        let mut u = RunUsage::default();
        u.record(
            "m",
            Tokens {
                input: 3,
                output: 4,
                cached: 1,
                reasoning: 2,
            },
            &Prices::default(),
        );
        let json = serde_json::to_value(&u).unwrap();
        assert_eq!(json["m"]["inputTokens"], 3);
        assert_eq!(json["m"]["cost"], serde_json::Value::Null);
        assert_eq!(serde_json::from_value::<RunUsage>(json).unwrap(), u);
    }
}

//! The operator's prices (`--prices FILE`): per model, what a million input, output and
//! cached input tokens cost, in one currency. A model without a price has no cost; nothing
//! is guessed.

use super::Tokens;
use serde::Deserialize;
use std::collections::HashMap;

/// One model's price per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Input read from the provider's prompt cache; the input price when not given.
    #[serde(default)]
    pub cached_input: Option<f64>,
}

/// The price table: `currency:` and `models:` (model name → [`Price`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    #[serde(default)]
    pub currency: Option<String>,
    #[serde(default)]
    pub models: HashMap<String, Price>,
}

/// Why a prices file was refused (at start-up: a server never runs with a table it misread).
#[derive(Debug, thiserror::Error)]
pub enum PricesError {
    #[error("the prices file is not valid YAML for agentd's table: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("the price of {0} is not a finite number at or above zero")]
    Negative(String),
    #[error("prices are given but no `currency:` says in what")]
    NoCurrency,
}

impl Prices {
    /// Reads the YAML form (see docs/usage.md).
    pub fn parse(yaml: &str) -> Result<Self, PricesError> {
        let prices: Prices = serde_yaml_ng::from_str(yaml)?;
        for (model, p) in &prices.models {
            let all = [Some(p.input), Some(p.output), p.cached_input];
            if all.iter().flatten().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(PricesError::Negative(model.clone()));
            }
        }
        if !prices.models.is_empty() && prices.currency.is_none() {
            return Err(PricesError::NoCurrency);
        }
        Ok(prices)
    }

    /// What one call of `model` with `tokens` cost, if the model has a price.
    pub fn cost(&self, model: &str, tokens: Tokens) -> Option<f64> {
        let p = self.models.get(model)?;
        let cached = tokens.cached.min(tokens.input);
        let fresh = tokens.input - cached;
        let cost = fresh as f64 * p.input
            + cached as f64 * p.cached_input.unwrap_or(p.input)
            + tokens.output as f64 * p.output;
        Some(cost / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_table_is_refused_with_its_reason() {
        let negative = "currency: USD\nmodels:\n  m: {input: -1, output: 1}\n";
        assert!(matches!(Prices::parse(negative), Err(PricesError::Negative(m)) if m == "m"));
        let no_currency = "models:\n  m: {input: 1, output: 1}\n";
        assert!(matches!(
            Prices::parse(no_currency),
            Err(PricesError::NoCurrency)
        ));
        let unknown = "currency: USD\nmodels:\n  m: {input: 1, output: 1, cache: 1}\n";
        assert!(matches!(Prices::parse(unknown), Err(PricesError::Yaml(_))));
    }

    #[test]
    fn cached_input_costs_the_input_price_unless_given() {
        let p = Prices::parse("currency: EUR\nmodels:\n  m: {input: 2, output: 4}\n").unwrap();
        let t = Tokens {
            input: 1_000_000,
            output: 0,
            cached: 500_000,
            reasoning: 0,
        };
        assert_eq!(p.cost("m", t), Some(2.0));
        assert_eq!(p.cost("other", t), None);
    }
}

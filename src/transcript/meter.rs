//! What one run spends, counted as it spends it (docs/usage.md).
//!
//! Every model call's tokens are added to the run's [`RunUsage`] here; the outbox writes the
//! total with the run's next commit ([`crate::store::SessionStore::append_metered`]), so the
//! database always knows what the run spent up to its last committed event. With budgets,
//! every model call first asks the database what each payer (the user in the app, the app,
//! the API key) has spent (ended runs and its other running runs as far as they have
//! committed) and adds what this run has not committed yet: two runs of one payer on two
//! replicas overshoot a budget by at most the one call each has in flight.

use crate::store::UsageStore;
use crate::usage::{Exhausted, Limit, Prices, RunUsage, Tokens};
use std::sync::{Arc, Mutex};

/// A run's meter.
pub struct Meter {
    prices: Arc<Prices>,
    /// The budgets the run was admitted under (none: no checks).
    limits: Vec<Limit>,
    /// The run is charged to an API key.
    keyed: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    usage: RunUsage,
    /// What the run's commits have written so far.
    committed: RunUsage,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Meter {
    /// A meter counting from `seed` (what a run taken over had committed).
    pub fn new(
        prices: Arc<Prices>,
        limits: Vec<Limit>,
        seed: Option<RunUsage>,
        keyed: bool,
    ) -> Self {
        let seed = seed.unwrap_or_default();
        Meter {
            prices,
            limits,
            keyed,
            state: Mutex::new(State {
                usage: seed.clone(),
                committed: seed,
            }),
        }
    }

    /// Counts one model call of `model` (the configured name) in app `app`.
    pub fn record(&self, app: &str, model: &str, tokens: Tokens) {
        let cost = self.prices.cost(model, tokens);
        lock(&self.state).usage.record(model, tokens, &self.prices);
        let kinds = [
            ("input", tokens.input),
            ("output", tokens.output),
            ("cached", tokens.cached),
            ("reasoning", tokens.reasoning),
        ];
        for (kind, n) in kinds {
            metrics::counter!("agentd_model_tokens_total", "app" => app.to_string(), "model" => model.to_string(), "kind" => kind)
                .increment(n);
        }
        if let (Some(cost), Some(currency)) = (cost, &self.prices.currency) {
            metrics::gauge!("agentd_model_cost_total", "app" => app.to_string(), "model" => model.to_string(), "currency" => currency.clone())
                .increment(cost);
        }
    }

    /// Whether the run is charged to an API key (its end adds to the key's aggregates).
    pub fn keyed(&self) -> bool {
        self.keyed
    }

    /// The run's usage if a commit has not written it yet.
    pub fn pending(&self) -> Option<RunUsage> {
        let st = lock(&self.state);
        (st.usage != st.committed).then(|| st.usage.clone())
    }

    /// A commit wrote `usage`.
    pub(super) fn committed(&self, usage: RunUsage) {
        lock(&self.state).committed = usage;
    }

    /// The run's usage so far.
    pub fn usage(&self) -> RunUsage {
        lock(&self.state).usage.clone()
    }

    /// Whether another model call is within every budget of the run. A failed read lets the
    /// call go (a database that cannot answer must not stop every agent); it is logged.
    pub async fn check(&self, store: &dyn UsageStore) -> Result<(), Exhausted> {
        if self.limits.is_empty() {
            return Ok(());
        }
        let unsaved = {
            let st = lock(&self.state);
            st.usage.beyond(&st.committed)
        };
        match crate::store::usage::exhausted(store, &self.limits, unsaved).await {
            Ok(Some(spent)) => Err(spent),
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "could not read what was spent; the model call goes ahead");
                Ok(())
            }
        }
    }
}

//! Budgets: what one payer (a user in an app, a whole app, or an API key) may spend, in tokens
//! per UTC day and/or in cost per UTC calendar month, and what is spent in the current windows.

use chrono::{Datelike, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

pub const DAY_SECS: i64 = 86_400;

/// Whose spending a budget bounds. A run is held to every budget that applies to it: its
/// user's in its app, its app's, and the API key's that started it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Payer {
    /// One user in one app.
    User { app: String, user: String },
    /// Every user of one app together.
    App { app: String },
    /// One API key, in every app it may use. `user` is the one user a key acts as (its
    /// spending is then read on that user's shard); `None` for an admin key, which acts for
    /// any user.
    Key { id: String, user: Option<String> },
}

impl Payer {
    /// What names the payer's rows: (app, user, key), with `''` for what the payer does not
    /// name (ids are never empty). A user's and an app's budget are `budgets` rows keyed by
    /// (app, user); a key's is on its `api_keys` row.
    pub fn columns(&self) -> (&str, &str, &str) {
        match self {
            Payer::User { app, user } => (app, user, ""),
            Payer::App { app } => (app, "", ""),
            Payer::Key { id, user } => ("", user.as_deref().unwrap_or(""), id),
        }
    }

    /// Whose budget it is, for messages: "the user's budget in this app" and the like.
    pub fn whose(&self) -> &'static str {
        match self {
            Payer::User { .. } => "the user's budget in this app",
            Payer::App { .. } => "the app's budget",
            Payer::Key { .. } => "the API key's budget",
        }
    }
}

/// The API key a run is charged to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargedKey {
    pub id: String,
    /// The one user the key acts as; `None` for an admin key (it acts for any user).
    pub user: Option<String>,
}

impl ChargedKey {
    pub fn payer(&self) -> Payer {
        Payer::Key {
            id: self.id.clone(),
            user: self.user.clone(),
        }
    }
}

/// A budget with its payer: what one run is checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub payer: Payer,
    pub budget: Budget,
}

/// A budget one payer has spent: nothing more is called before `reset` (Unix seconds).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{} is spent until {}", .payer.whose(), iso_time(*.reset))]
pub struct Exhausted {
    pub payer: Payer,
    pub reset: i64,
}

/// A user's budget in an app, an app's or a key's. Either bound may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    /// Input plus output tokens per UTC day.
    #[serde(default)]
    pub tokens_per_day: Option<u64>,
    /// Cost per UTC calendar month, in the prices' currency (priced models only).
    #[serde(default)]
    pub cost_per_month: Option<f64>,
}

/// What is spent in the budget's current windows: ended runs' aggregates plus what the
/// payer's running runs have committed so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Spent {
    pub tokens_today: u64,
    pub cost_this_month: f64,
}

/// The budget windows around one instant: today and this month, as days since 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub today: i64,
    pub month_first: i64,
    pub next_month_first: i64,
}

impl Window {
    /// The windows at `unix_secs`.
    pub fn at(unix_secs: f64) -> Self {
        let today = (unix_secs / DAY_SECS as f64).floor() as i64;
        let date = day_date(today);
        let first = NaiveDate::from_ymd_opt(date.year(), date.month(), 1).unwrap_or(date);
        let next = match date.month() {
            12 => NaiveDate::from_ymd_opt(date.year() + 1, 1, 1),
            m => NaiveDate::from_ymd_opt(date.year(), m + 1, 1),
        }
        .unwrap_or(date);
        Window {
            today,
            month_first: date_day(first),
            next_month_first: date_day(next),
        }
    }

    pub fn now() -> Self {
        Self::at(Utc::now().timestamp_micros() as f64 / 1e6)
    }
}

impl Budget {
    /// Whether `spent` has reached a bound; with the Unix time (seconds) that bound's window
    /// resets at.
    pub fn exhausted(&self, spent: &Spent, w: &Window) -> Option<i64> {
        let tokens = self
            .tokens_per_day
            .filter(|limit| spent.tokens_today >= *limit)
            .map(|_| (w.today + 1) * DAY_SECS);
        let cost = self
            .cost_per_month
            .filter(|limit| spent.cost_this_month >= *limit)
            .map(|_| w.next_month_first * DAY_SECS);
        // Spending is allowed again only when every exhausted window has reset.
        tokens.into_iter().chain(cost).max()
    }

    /// Whether the budget is well formed: bounds at or above zero, finite.
    pub fn valid(&self) -> bool {
        self.cost_per_month
            .is_none_or(|c| c.is_finite() && c >= 0.0)
    }
}

/// A Unix time as RFC 3339 (UTC).
pub fn iso_time(unix_secs: i64) -> String {
    chrono::DateTime::from_timestamp(unix_secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// The date of a day number.
pub fn day_date(day: i64) -> NaiveDate {
    Utc.timestamp_opt(day.saturating_mul(DAY_SECS), 0)
        .single()
        .map(|t| t.date_naive())
        .unwrap_or_default()
}

/// The day number of a date.
pub fn date_day(date: NaiveDate) -> i64 {
    date.and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc().timestamp() / DAY_SECS)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_utc_calendar() {
        // 2026-12-31T23:59:59Z.
        let w = Window::at(1_798_761_599.0);
        assert_eq!(day_date(w.today).to_string(), "2026-12-31");
        assert_eq!(day_date(w.month_first).to_string(), "2026-12-01");
        assert_eq!(day_date(w.next_month_first).to_string(), "2027-01-01");
    }

    #[test]
    fn a_budget_is_exhausted_until_every_spent_window_resets() {
        let w = Window::at(1_798_761_599.0);
        let b = Budget {
            tokens_per_day: Some(100),
            cost_per_month: Some(1.0),
        };
        let under = Spent {
            tokens_today: 99,
            cost_this_month: 0.5,
        };
        assert_eq!(b.exhausted(&under, &w), None);
        let tokens = Spent {
            tokens_today: 100,
            cost_this_month: 0.5,
        };
        assert_eq!(b.exhausted(&tokens, &w), Some((w.today + 1) * DAY_SECS));
        let both = Spent {
            tokens_today: 100,
            cost_this_month: 1.0,
        };
        assert_eq!(b.exhausted(&both, &w), Some(w.next_month_first * DAY_SECS));
    }
}

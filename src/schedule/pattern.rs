//! A schedule's pattern: standard 5-field cron, or 6 with seconds first, evaluated in an IANA
//! time zone, with DST as croner defines it (a fixed local time in the spring-forward gap fires
//! at the first valid time after it, a wildcard or stepped time there is skipped; a local time
//! that exists twice fires once). And the tick plan: which tick a due schedule fires now.

use crate::error_code::ErrorCode;
use crate::store::{ScheduleRecord, TickPlan};
use chrono::{DateTime, Datelike, Utc};
use croner::parser::{CronParser, Seconds, Year};
use std::str::FromStr;

/// How far ahead a pattern must match to be stored.
const NEVER_AFTER_YEARS: u32 = 100;

/// With `catchUp: "none"`, a tick later than this is skipped as missed.
pub const MISSED_AFTER_SECS: f64 = 60.0;

/// What a schedule does with ticks missed while no replica ran it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Fire the latest missed tick once (never a burst).
    One,
    /// Skip them.
    None,
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::One => "one",
            CatchUp::None => "none",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Pattern {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
}

/// Why a pattern or zone was refused: a stable code and a sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct PatternError {
    pub code: ErrorCode,
    pub message: String,
}

impl Pattern {
    pub fn parse(cron: &str, timezone: &str) -> Result<Pattern, PatternError> {
        let fields = cron.split_whitespace().count();
        // Printable ASCII fields separated by spaces: no newline or control character is
        // stored (and shown back) as part of a pattern.
        let printable = cron.chars().all(|c| c == ' ' || c.is_ascii_graphic());
        if !(fields == 5 || fields == 6) || cron.len() > 256 || !printable {
            return Err(PatternError {
                code: ErrorCode::InvalidCron,
                message: format!(
                    "a cron pattern has 5 fields (minute hour day-of-month month day-of-week), \
                     or 6 with seconds first; {cron:?} has {fields}"
                ),
            });
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|e| PatternError {
                code: ErrorCode::InvalidCron,
                message: format!("{cron:?} is not a cron pattern: {e}"),
            })?;
        let tz = chrono_tz::Tz::from_str(timezone).map_err(|_| PatternError {
            code: ErrorCode::InvalidTimezone,
            message: format!(
                "{timezone:?} is not an IANA time zone (e.g. \"Europe/Paris\", \"UTC\")"
            ),
        })?;
        let p = Pattern { cron, tz };
        // A pattern that never matches (e.g. February 30th) is refused rather than stored
        // idle. croner would look up to the year 5000 for a match, tens of milliseconds of CPU
        // per request: the next 100 years are enough.
        if p.next_within(crate::event::now_ts(), NEVER_AFTER_YEARS)
            .is_none()
        {
            return Err(PatternError {
                code: ErrorCode::InvalidCron,
                message: "the pattern never matches".into(),
            });
        }
        Ok(p)
    }

    /// The first tick after `t` within `years` (by day: a pattern's day fields decide whether it
    /// matches at all, so one probe a day finds the first matching day).
    fn next_within(&self, t: f64, years: u32) -> Option<f64> {
        let start = self.at(t)?;
        let end = t + f64::from(years) * 366.0 * 86_400.0;
        let mut day = start.date_naive();
        while let Some(midnight) = day.and_hms_opt(0, 0, 0) {
            let at = midnight.and_utc().timestamp() as f64;
            if at > end {
                return None;
            }
            let p = &self.cron.pattern;
            let matches = p.month_match(day.month()).unwrap_or(false)
                && p.day_match(day.year(), day.month(), day.day())
                    .unwrap_or(false);
            if matches {
                return self.next_after(t.max(at - 86_400.0));
            }
            day = day.succ_opt()?;
        }
        None
    }

    /// The shortest time between two of the pattern's ticks, at least (from the fields that
    /// match: several seconds of a minute, else several minutes of an hour, else several
    /// hours of a day, else a day).
    pub fn min_interval_secs(&self) -> u64 {
        let p = &self.cron.pattern;
        let matching =
            |n: u32, f: &dyn Fn(u32) -> bool| -> Vec<u32> { (0..n).filter(|v| f(*v)).collect() };
        let gap = |values: &[u32], n: u32| -> Option<u64> {
            if values.len() < 2 {
                return None;
            }
            let mut g = n - values[values.len() - 1] + values[0];
            for w in values.windows(2) {
                g = g.min(w[1] - w[0]);
            }
            Some(u64::from(g))
        };
        let seconds = matching(60, &|s| p.second_match(s).unwrap_or(false));
        let minutes = matching(60, &|m| p.minute_match(m).unwrap_or(false));
        let hours = matching(24, &|h| p.hour_match(h).unwrap_or(false));
        gap(&seconds, 60)
            .or_else(|| gap(&minutes, 60).map(|g| g * 60))
            .or_else(|| gap(&hours, 24).map(|g| g * 3600))
            .unwrap_or(86_400)
    }

    /// `t` in the zone, in whole seconds (cron's unit: croner keeps a fraction it is given).
    fn at(&self, t: f64) -> Option<DateTime<chrono_tz::Tz>> {
        DateTime::<Utc>::from_timestamp(t.floor() as i64, 0).map(|d| d.with_timezone(&self.tz))
    }

    /// The first tick strictly after `t` (seconds since the epoch).
    pub fn next_after(&self, t: f64) -> Option<f64> {
        let start = self.at(t)?;
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        Some(next.timestamp_millis() as f64 / 1000.0)
    }

    /// The last tick at or before `t`.
    pub fn last_at_or_before(&self, t: f64) -> Option<f64> {
        let start = self.at(t)?;
        let prev = self.cron.find_previous_occurrence(&start, true).ok()?;
        Some(prev.timestamp_millis() as f64 / 1000.0)
    }
}

/// The tick a due schedule fires at `now`, and its next one. Only the latest due tick can
/// fire (a schedule never bursts); with `catchUp: "none"` only if it is less than
/// [`MISSED_AFTER_SECS`] late. The next tick is at least `min_secs` after the one fired: a
/// schedule stored before a server's minimum period fires no faster than it.
pub fn plan_with_min(s: &ScheduleRecord, now: f64, min_secs: u64) -> TickPlan {
    let plan = plan(s, now);
    match (plan.fire, plan.next, Pattern::parse(&s.cron, &s.timezone)) {
        (Some(fired), Some(next), Ok(p)) if next - fired < min_secs as f64 => TickPlan {
            next: p.next_after(fired + min_secs as f64 - 1.0),
            ..plan
        },
        _ => plan,
    }
}

/// [`plan_with_min`] without a minimum period.
pub fn plan(s: &ScheduleRecord, now: f64) -> TickPlan {
    let (Ok(p), Some(due)) = (Pattern::parse(&s.cron, &s.timezone), s.next_tick) else {
        return TickPlan {
            fire: None,
            next: None,
        };
    };
    let latest = p.last_at_or_before(now).map_or(due, |l| l.max(due));
    let fire = match s.catch_up.as_str() {
        "none" if now - latest > MISSED_AFTER_SECS => None,
        _ => Some(latest),
    };
    TickPlan {
        fire,
        next: p.next_after(now.max(latest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(cron: &str, catch_up: &str, next_tick: f64) -> ScheduleRecord {
        ScheduleRecord {
            id: "s".into(),
            app_name: "a".into(),
            user_id: "u".into(),
            cron: cron.into(),
            timezone: "UTC".into(),
            message: serde_json::json!({}),
            session_id: None,
            on_busy: "reject".into(),
            catch_up: catch_up.into(),
            webhook: None,
            enabled: true,
            next_tick: Some(next_tick),
            created_at: 0.0,
            updated_at: 0.0,
            created_by: None,
            paused_reason: None,
        }
    }

    #[test]
    fn parses_five_and_six_fields_and_zones() {
        assert!(Pattern::parse("*/5 * * * *", "Europe/Paris").is_ok());
        assert!(Pattern::parse("*/2 * * * * *", "UTC").is_ok());
        assert_eq!(
            Pattern::parse("* * *", "UTC").unwrap_err().code,
            ErrorCode::InvalidCron
        );
        assert_eq!(
            Pattern::parse("61 * * * *", "UTC").unwrap_err().code,
            ErrorCode::InvalidCron
        );
        assert_eq!(
            Pattern::parse("0 0 30 2 *", "UTC").unwrap_err().code,
            ErrorCode::InvalidCron
        );
        assert_eq!(
            Pattern::parse("* * * * *", "Mars/Olympus")
                .unwrap_err()
                .code,
            ErrorCode::InvalidTimezone
        );
    }

    #[test]
    fn next_and_last() {
        let p = Pattern::parse("*/2 * * * * *", "UTC").unwrap();
        assert_eq!(p.next_after(100.0), Some(102.0));
        assert_eq!(p.next_after(101.5), Some(102.0));
        assert_eq!(p.last_at_or_before(101.5), Some(100.0));
        assert_eq!(p.last_at_or_before(102.0), Some(102.0));
        // 09:00 in Paris is 08:00 UTC in winter (2026-01-15) and 07:00 UTC in summer.
        let paris = Pattern::parse("0 9 * * *", "Europe/Paris").unwrap();
        let jan = 1_768_435_200.0; // 2026-01-15T00:00:00Z
        assert_eq!(paris.next_after(jan), Some(jan + 8.0 * 3600.0));
        let jul = 1_784_073_600.0; // 2026-07-15T00:00:00Z
        assert_eq!(paris.next_after(jul), Some(jul + 7.0 * 3600.0));
    }

    #[test]
    fn a_missed_tick_fires_once_or_not_at_all() {
        // Due at 100; the replicas were down until 1000.5.
        let one = plan(&sched("*/2 * * * * *", "one", 100.0), 1000.5);
        assert_eq!(one.fire, Some(1000.0));
        assert_eq!(one.next, Some(1002.0));
        let none = plan(&sched("*/2 * * * * *", "none", 100.0), 1000.5);
        assert_eq!(none.fire, Some(1000.0), "the latest tick is on time");
        // Hourly, due at 0, looked at 100 s after the 7200 tick: too late with "none".
        let none = plan(&sched("0 0 * * * *", "none", 0.0), 7300.0);
        assert_eq!(none.fire, None);
        assert_eq!(none.next, Some(10800.0));
        let one = plan(&sched("0 0 * * * *", "one", 0.0), 7300.0);
        assert_eq!(one.fire, Some(7200.0));
    }
}

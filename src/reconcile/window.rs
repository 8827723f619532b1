//! The period a reconciliation covers: sent records by their own time in `[from, to)`, and
//! processed records by their topic timestamp in `[from, to + grace)`, so an event sent just
//! before `to` and processed a little after still reconciles. Outside it, a record is counted as
//! outside the window, neither sent nor processed: a nightly run compares one day, not everything
//! either side ever held.

use serde_json::Value;

/// A reconciliation's time window, in epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// First millisecond covered.
    pub from_ms: i64,
    /// First millisecond past the sent period.
    pub to_ms: i64,
    /// How long after `to` processed records still count.
    pub grace_ms: i64,
    /// The JSON field or CSV column of a sent file's record time (epoch ms or RFC 3339); topic
    /// records use their timestamp.
    pub sent_time_field: Option<String>,
}

impl Window {
    /// True when a sent record of time `ms` is covered.
    pub fn has_sent(&self, ms: i64) -> bool {
        (self.from_ms..self.to_ms).contains(&ms)
    }

    /// True when a processed record of timestamp `ms` is covered.
    pub fn has_processed(&self, ms: i64) -> bool {
        (self.from_ms..self.to_ms.saturating_add(self.grace_ms)).contains(&ms)
    }

    /// Whether a sent JSON object falls in the window, by its time field.
    pub fn has_sent_value(&self, value: &Value) -> Result<bool, String> {
        let field = self.time_field()?;
        match value.get(field) {
            Some(Value::Number(n)) => match n.as_i64() {
                Some(ms) => Ok(self.has_sent(ms)),
                None => Err(format!("time field `{field}` is {n}, not epoch milliseconds")),
            },
            Some(Value::String(s)) => parse_time(s)
                .map(|ms| self.has_sent(ms))
                .map_err(|e| format!("time field `{field}`: {e}")),
            Some(_) => Err(format!("time field `{field}` is not a number or a string")),
            None => Err(format!("the record has no time field `{field}`")),
        }
    }

    /// Whether a sent CSV cell's time falls in the window.
    pub fn has_sent_text(&self, text: &str) -> Result<bool, String> {
        let field = self.time_field()?;
        parse_time(text)
            .map(|ms| self.has_sent(ms))
            .map_err(|e| format!("time column `{field}`: {e}"))
    }

    /// The sent file's time field.
    pub fn time_field(&self) -> Result<&str, String> {
        self.sent_time_field
            .as_deref()
            .ok_or_else(|| "no --sent-time-field to place the record in the window".to_string())
    }
}

/// A time as epoch milliseconds, or RFC 3339 (`2026-12-03T00:00:00Z`, a fraction and an offset
/// allowed).
pub fn parse_time(text: &str) -> Result<i64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let at = humantime::parse_rfc3339_weak(text)
        .map_err(|e| format!("`{text}` is neither epoch milliseconds nor an RFC 3339 time ({e})"))?;
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .map_err(|_| format!("`{text}` is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        Window {
            from_ms: 1_000,
            to_ms: 2_000,
            grace_ms: 500,
            sent_time_field: Some("sent_at".into()),
        }
    }

    #[test]
    fn sent_records_count_in_from_to_and_processed_ones_until_the_grace_ends() {
        let w = window();
        assert!(!w.has_sent(999) && w.has_sent(1_000) && w.has_sent(1_999) && !w.has_sent(2_000));
        assert!(w.has_processed(2_000) && w.has_processed(2_499) && !w.has_processed(2_500));
        assert!(!w.has_processed(999));
    }

    #[test]
    fn a_sent_time_is_epoch_milliseconds_or_rfc3339() {
        let w = window();
        assert_eq!(w.has_sent_value(&serde_json::json!({"sent_at": 1500})), Ok(true));
        assert_eq!(w.has_sent_value(&serde_json::json!({"sent_at": "2500"})), Ok(false));
        assert_eq!(parse_time("1970-01-01T00:00:01.5Z"), Ok(1_500));
        assert_eq!(parse_time("1970-01-01 00:00:02"), Ok(2_000));
        let missing = w.has_sent_value(&serde_json::json!({"at": 1})).expect_err("no field");
        assert!(missing.contains("sent_at"), "{missing}");
        assert!(w.has_sent_text("yesterday").is_err());
        assert!(w.has_sent_value(&serde_json::json!({"sent_at": 1.5})).is_err());
    }
}

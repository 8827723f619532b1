//! Recovery tools for the operator: what to do once the reconciler found something.

pub mod acknowledge;
pub mod inspect;
pub mod redrive;
pub mod reset;
pub mod state;
pub mod surgery;

use std::fmt::Write;
use std::time::{Duration, UNIX_EPOCH};

/// `ms` since the epoch as RFC 3339 (UTC, milliseconds), or, for an instant RFC 3339 cannot
/// write (before 1970 or past the year 9999: a stored or record timestamp anyone could have
/// set), the number itself.
pub fn timestamp_text(ms: i64) -> String {
    let mut text = String::new();
    let written = u64::try_from(ms)
        .ok()
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .is_some_and(|at| write!(text, "{}", humantime::format_rfc3339_millis(at)).is_ok());
    if written {
        text
    } else {
        format!("{ms} ms since the epoch")
    }
}

#[cfg(test)]
mod tests {
    use super::timestamp_text;

    #[test]
    fn any_timestamp_has_a_text() {
        assert_eq!(timestamp_text(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(timestamp_text(0), "1970-01-01T00:00:00.000Z");
        // Year 10000 and later, and negatives, are written as numbers instead of panicking.
        assert_eq!(
            timestamp_text(253_402_300_800_000),
            "253402300800000 ms since the epoch"
        );
        assert_eq!(timestamp_text(i64::MAX), format!("{} ms since the epoch", i64::MAX));
        assert_eq!(timestamp_text(-5), "-5 ms since the epoch");
    }
}

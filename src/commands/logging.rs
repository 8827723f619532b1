//! Log output: structured lines on stderr, text or JSON, filtered by `RUST_LOG`.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Default filter of long-running commands.
pub const DEFAULT_FILTER: &str = "info,librdkafka=warn,rdkafka=warn";

/// Installs the global subscriber; `json` selects one JSON object per line, `default_filter`
/// applies when `RUST_LOG` is unset.
pub fn init(json: bool, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file, pipe or collector would keep the
        // escape codes as text.
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ));
    // A second init (tests) keeps the first subscriber; that is fine.
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Whether text logs are coloured: on a terminal, unless `NO_COLOR` is set to anything but the
/// empty string (<https://no-color.org>).
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None), "a file or pipe gets no escape codes");
    }
}

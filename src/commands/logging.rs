//! Log output: structured lines on stderr, text or JSON, filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Default filter of long-running commands.
pub const DEFAULT_FILTER: &str = "info,librdkafka=warn,rdkafka=warn";

/// Installs the global subscriber; `json` selects one JSON object per line, `default_filter`
/// applies when `RUST_LOG` is unset.
pub fn init(json: bool, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber; that is fine.
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

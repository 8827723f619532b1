//! Log output: structured lines on stderr, text or JSON, filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; `json` selects one JSON object per line.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,librdkafka=warn,rdkafka=warn"));
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

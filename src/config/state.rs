//! `state:`: where the stores live, how long unused task directories stay, and the memory the
//! stores share.

use super::diagnostics::Collector;
use super::raw::RawState;
use crate::topology::StateMemory;
use serde_saphyr::Spanned;
use std::path::PathBuf;
use std::time::Duration;

/// The validated `state:` section.
pub struct State {
    /// Root of the stores (default `./state`).
    pub dir: PathBuf,
    /// How long an unused task directory is kept.
    pub cleanup_delay: Option<Duration>,
    /// The stores' shared budgets.
    pub memory: Option<StateMemory>,
}

/// Checks `state:`, reporting every problem into `c`.
pub fn state(c: &mut Collector, raw: Option<RawState>) -> State {
    let raw = raw.unwrap_or_default();
    let dir = raw
        .dir
        .map_or_else(|| PathBuf::from("./state"), |d| PathBuf::from(d.value));
    let cleanup_delay = match raw.cleanup_delay_ms {
        None => Some(Duration::from_secs(600)),
        Some(d) if d.value >= 1_000 => Some(Duration::from_millis(d.value)),
        Some(d) => {
            c.at_loc(
                d.referenced,
                format!("`state.cleanup_delay_ms` is {}; use at least 1000", d.value),
            );
            None
        }
    };
    let defaults = StateMemory::default();
    let at = raw
        .write_buffer_bytes
        .as_ref()
        .or(raw.block_cache_bytes.as_ref())
        .map(|s| s.referenced);
    let cache = bytes(
        c,
        raw.block_cache_bytes,
        "block_cache_bytes",
        defaults.block_cache_bytes,
        StateMemory::MIN_BYTES,
    );
    let buffers = bytes(
        c,
        raw.write_buffer_bytes,
        "write_buffer_bytes",
        defaults.write_buffer_bytes,
        StateMemory::MIN_BYTES,
    );
    let recent = bytes(
        c,
        raw.recent_values_bytes,
        "recent_values_bytes",
        defaults.recent_values_bytes,
        0,
    );
    let memory = match (cache, buffers, recent) {
        (Some(cache), Some(buffers), Some(_)) if buffers > cache => {
            let message = format!(
                "`state.write_buffer_bytes` ({buffers}) is larger than `state.block_cache_bytes` ({cache}): \
                 the memtables are charged to the block cache, so raise the cache or lower the memtables"
            );
            match at {
                Some(at) => c.at_loc(at, message),
                None => c.at(0, 0, message),
            }
            None
        }
        (Some(block_cache_bytes), Some(write_buffer_bytes), Some(recent_values_bytes)) => Some(StateMemory {
            block_cache_bytes,
            write_buffer_bytes,
            recent_values_bytes,
        }),
        _ => None,
    };
    State {
        dir,
        cleanup_delay,
        memory,
    }
}

/// A byte budget of at least `min`, `default` when absent.
fn bytes(c: &mut Collector, raw: Option<Spanned<u64>>, name: &str, default: usize, min: usize) -> Option<usize> {
    let Some(raw) = raw else { return Some(default) };
    match usize::try_from(raw.value) {
        Ok(v) if v >= min => Some(v),
        _ => {
            c.at_loc(
                raw.referenced,
                format!("`state.{name}` is {}; use at least {min} (1 MiB is 1048576)", raw.value),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::load_str;
    use crate::topology::StateMemory;

    fn load(state: &str) -> Result<crate::topology::Topology, crate::config::ConfigError> {
        let yaml = format!(
            "application_id: a\nkafka: {{ bootstrap_servers: b }}\nstate: {state}\nsources:\n  p: {{ topic: t }}\n\
             pipelines:\n  - name: n\n    from: p\n    key: \"{{id}}\"\n    to: {{ topic: o }}\ndead_letter: {{ topic: d }}\n"
        );
        load_str("t.yaml", &yaml, |_| None)
    }

    #[test]
    fn memory_defaults_apply_to_what_is_not_set() {
        let t = load("{ dir: /tmp/s }").expect("valid");
        assert_eq!(t.state_memory, StateMemory::default());
        let t = load("{ block_cache_bytes: 134217728, recent_values_bytes: 0 }").expect("valid");
        assert_eq!(
            t.state_memory,
            StateMemory {
                block_cache_bytes: 128 << 20,
                write_buffer_bytes: StateMemory::default().write_buffer_bytes,
                recent_values_bytes: 0,
            }
        );
    }

    #[test]
    fn every_bad_budget_is_reported_with_its_line() {
        let e = load("\n  block_cache_bytes: 1000\n  write_buffer_bytes: 0\n  cleanup_delay_ms: 5")
            .expect_err("invalid")
            .to_string();
        assert!(
            e.contains("t.yaml:4:") && e.contains("`state.block_cache_bytes` is 1000; use at least 1048576"),
            "{e}"
        );
        assert!(
            e.contains("t.yaml:5:") && e.contains("`state.write_buffer_bytes` is 0"),
            "{e}"
        );
        assert!(e.contains("`state.cleanup_delay_ms` is 5"), "{e}");
    }

    #[test]
    fn memtables_larger_than_the_cache_they_are_charged_to_are_refused() {
        let e = load("{ block_cache_bytes: 2097152, write_buffer_bytes: 4194304 }")
            .expect_err("invalid")
            .to_string();
        assert!(
            e.contains("`state.write_buffer_bytes` (4194304) is larger than `state.block_cache_bytes` (2097152)"),
            "{e}"
        );
        // The default cache (64 MiB) is too small for 100 MiB of memtables set alone.
        let e = load("{ write_buffer_bytes: 104857600 }")
            .expect_err("invalid")
            .to_string();
        assert!(e.contains("raise the cache or lower the memtables"), "{e}");
    }
}

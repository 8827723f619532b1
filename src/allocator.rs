//! The process's allocator: mimalloc, for Rust and, through its `override` feature, for
//! librdkafka and RocksDB too, set up to keep little more resident than tally uses.
//! Part of the binary only: tests and fuzz targets keep their own allocators.

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc instead of glibc malloc: malloc and free were ~18% of the stream thread's CPU on the
/// payments benchmark (per-record JSON maps, strings and overlay entries), and under librdkafka
/// and RocksDB too the drain ran at 18 CPU-s per 1M records instead of 21.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_e` (libmimalloc-sys names only the
/// options of older releases; this one has kept its place since it replaced `reset_delay`).
/// Cargo.toml pins libmimalloc-sys, and the test below fails if the index means another option.
const PURGE_DELAY: mi_option_t = 15;
/// The environment variable mimalloc reads the same option from at start.
const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

/// mimalloc's purge delay in ms, instead of its default second: a drain frees fetch and produce
/// buffers all the time, and holding each for a second kept ~18 MiB more resident (peak RSS
/// 72-74 MiB against 53-56 with no delay on the payments benchmark), while purging at once put
/// an madvise call behind most frees (14% of the stream thread's samples under perf). Back to
/// back on three workloads, 20 ms cost 12-15% less CPU than 0 for 4-11 MiB more peak RSS.
const PURGE_DELAY_MS: std::ffi::c_long = 20;

/// Sets the purge delay unless the environment sets it (then mimalloc has read it at start).
pub fn configure() {
    if std::env::var_os(PURGE_DELAY_ENV).is_none() {
        // SAFETY: mi_option_set stores a number in mimalloc's option table; any option index
        // below `_mi_option_last` and any value are valid, and purge_delay is read per purge.
        unsafe { mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    #[test]
    fn the_purge_delay_option_is_the_one_configure_sets() {
        if std::env::var_os(PURGE_DELAY_ENV).is_some() {
            return;
        }
        // SAFETY: reading an option of mimalloc's table by a valid index.
        let default = unsafe { mi_option_get(PURGE_DELAY) };
        assert_eq!(
            default, 1000,
            "option {PURGE_DELAY} is not mimalloc's purge delay (default 1000 ms)"
        );
        configure();
        // SAFETY: as above.
        assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, PURGE_DELAY_MS);
    }
}

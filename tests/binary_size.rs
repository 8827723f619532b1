//! The release binary stays small enough for an image layer or a quick copy (issue 20; README,
//! "Run against your Kafka"). Cargo.toml strips tally's debug info at link time; without that the
//! line tables RocksDB's C++ brings make it ~460 MB.

use std::path::Path;

/// 60 MB, in decimal megabytes: the stricter reading of the limit.
const LIMIT_BYTES: u64 = 60_000_000;

#[test]
fn release_binary_is_at_most_60_mb() {
    let bin = Path::new(env!("CARGO_BIN_EXE_tally"));
    // `cargo test --release` (the README's test command) builds the binary this checks. Other
    // profiles keep their debug info on purpose (dev, and `profiling`, which exists for it).
    let profile = bin.parent().and_then(Path::file_name).and_then(|n| n.to_str());
    if profile != Some("release") {
        println!(
            "binary_size: skipped: {} is not a release build; run `cargo test --release`",
            bin.display()
        );
        return;
    }
    let size = std::fs::metadata(bin).expect("stat the tally binary").len();
    println!("binary_size: {} is {size} bytes", bin.display());
    assert!(
        size <= LIMIT_BYTES,
        "{} is {size} bytes, over the {LIMIT_BYTES}-byte limit: is `strip = \"debuginfo\"` still set \
         under [profile.release.package.tally] in Cargo.toml?",
        bin.display()
    );
}

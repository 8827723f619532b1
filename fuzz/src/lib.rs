//! What the fuzz targets share: a fixed environment, so every run of an input is the same.

/// Resolves `${VAR}` in topology text without reading the process environment: a few names
/// have fixed values (one holding YAML syntax, to check interpolation cannot break parsing
/// into a panic), every other name is unset so `${VAR:-default}` takes its default.
pub fn fixed_env(name: &str) -> Option<String> {
    match name {
        "KAFKA_BOOTSTRAP" => Some("127.0.0.1:9092".to_string()),
        "TALLY_APP_ID" => Some("fuzz".to_string()),
        "FUZZ_YAML" => Some("a: [1, {b: \"c\"}]\n- ]: &x *x".to_string()),
        "FUZZ_EMPTY" => Some(String::new()),
        _ => None,
    }
}

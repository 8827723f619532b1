//! `tally schema`: the JSON Schema editors use for topology files. The copy in the repository is
//! what tally prints, every example topology fits it, and it refuses what tally refuses by shape
//! (a misspelt key, a list where a map goes, text where a number goes).

use std::path::Path;
use std::process::Command;

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn the_schema_in_the_repository_is_what_tally_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("schema")
        .output()
        .expect("tally schema runs");
    assert!(out.status.success());
    let committed = std::fs::read_to_string(repo("schema/topology.schema.json")).expect("committed schema");
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "schema/topology.schema.json is stale: regenerate it with `tally schema > schema/topology.schema.json`"
    );
}

/// Validates each YAML document against the schema with Python's jsonschema (installed with
/// kubernetes-validate by scripts/setup); prints one verdict per document.
const CHECK: &str = r#"
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
for doc in sys.argv[2:]:
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(open(doc))))
    print(("ok " if not errors else "refused ") + doc + "".join(" | " + e.message for e in errors))
"#;

fn verdicts(docs: &[std::path::PathBuf]) -> Vec<String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(CHECK)
        .arg(repo("schema/topology.schema.json"))
        .args(docs)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the check ran (scripts/setup installs jsonschema and PyYAML): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn every_example_topology_fits_the_schema_and_shape_errors_do_not() {
    let examples: Vec<_> = std::fs::read_dir(repo("topologies"))
        .expect("topologies/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    assert!(examples.len() >= 5);
    for verdict in verdicts(&examples) {
        assert!(verdict.starts_with("ok "), "{verdict}");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let payments = std::fs::read_to_string(repo("topologies/payments.yaml")).expect("example");
    let bad = [
        ("misspelt", payments.replace("processing:", "procesing:")),
        (
            "list-for-map",
            payments.replace("sources:\n  payments:", "sources:\n  - payments:"),
        ),
        ("text-for-number", payments.replace("threads: 1", "threads: one")),
        (
            "unknown-route-key",
            payments.replace("strategy: ignore", "strategy: ignore\n        stratgey: x"),
        ),
    ];
    let mut paths = Vec::new();
    for (name, text) in &bad {
        assert_ne!(text, &payments, "{name}: the edit applies");
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, text).expect("write");
        paths.push(path);
    }
    for verdict in verdicts(&paths) {
        assert!(verdict.starts_with("refused "), "{verdict}");
    }
}

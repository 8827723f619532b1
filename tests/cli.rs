//! The command line without a broker: validate, describe, help, the mock-cluster demo, logs.

use std::process::Command;

fn tally(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .output()
        .expect("run tally")
}

#[test]
fn every_example_topology_validates_and_describes() {
    let mut files: Vec<String> = std::fs::read_dir("topologies")
        .expect("topologies dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let args: Vec<&str> = std::iter::once("validate")
        .chain(files.iter().map(String::as_str))
        .collect();
    let out = tally(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in &files {
        let out = tally(&["describe", f]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("-changelog"),
            "describe names the changelog topics: {text}"
        );
        for (format, head) in [("mermaid", "flowchart LR"), ("dot", "digraph ")] {
            let out = tally(&["describe", "--format", format, f]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let graph = String::from_utf8_lossy(&out.stdout);
            assert!(
                graph.starts_with(head) && graph.contains("-changelog"),
                "{format} of {f}: {graph}"
            );
        }
    }
}

#[test]
fn a_bad_topology_lists_every_problem_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        r#"application_id: "bad app"
kafka:
  bootstrap_servers: ${NO_SUCH_VAR_FOR_TALLY}
  properties: { isolation.level: read_uncommitted }
processing: { threads: 0 }
sources:
  s: { topic: in }
pipelines:
  - name: p
    from: nowhere
    key: "{payment_id"
    routes:
      - strategy: overwrite
      - strategy: ignore
        retention: forever
    to: { topic: out }
dead_letter: { topic: dlq }
"#,
    )
    .expect("write");
    let out = tally(&["validate", path.to_str().expect("utf8 path")]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for (line, needle) in [
        (1, "application_id"),
        (3, "NO_SUCH_VAR_FOR_TALLY"),
        (4, "isolation.level"),
        (5, "threads"),
        (10, "nowhere"),
        (11, "never closed"),
        (13, "uses strategy `overwrite` but has no `entity`"),
        (13, "uses strategy `overwrite` but has no `version`"),
        (15, "forever"),
    ] {
        let hit = err
            .lines()
            .any(|l| l.contains(&format!("bad.yaml:{line}:")) && l.contains(needle));
        assert!(hit, "expected a problem on line {line} about `{needle}` in:\n{err}");
    }
    assert!(err.contains("9 problems"), "{err}");
}

#[test]
fn help_lists_the_commands() {
    let out = tally(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "validate", "describe", "demo", "reconcile"] {
        assert!(text.contains(cmd), "{text}");
    }
}

/// `tally demo` with `env`, stderr piped; its exit status, report and log.
fn demo(events: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["demo", "--events", events])
        .envs(env.iter().copied())
        .output()
        .expect("run tally demo");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_demo_runs_to_the_end_on_the_mock_cluster() {
    let (status, report, log) = demo("300", &[]);
    assert!(status.success(), "{status}\n{report}\n{log}");
    assert!(
        report.contains("in = out + duplicates + stale + dead-letter: yes"),
        "{report}"
    );
    // Every distinct event comes out once: `out  N  (expected N)`.
    let out_line = report
        .lines()
        .find(|l| l.trim_start().starts_with("out "))
        .unwrap_or_else(|| panic!("no `out` line:\n{report}"));
    let numbers: Vec<&str> = out_line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(numbers, ["300", "300"], "{report}");
}

#[test]
fn text_logs_to_a_pipe_have_no_colour_codes() {
    // The demo's dead letters log warnings; RUST_LOG lets them (and info lines) through.
    let (status, _, log) = demo("100", &[("RUST_LOG", "info")]);
    assert!(status.success(), "{log}");
    assert!(
        log.contains(" WARN ") || log.contains(" INFO "),
        "text log lines:\n{log}"
    );
    assert!(!log.contains('\x1b'), "escape codes in a piped log:\n{log}");
}

//! tally's container image (deploy/container/Containerfile, built by scripts/image) against the
//! test broker, run the way README's "Container image" section runs it and deploy/k8s's
//! securityContext asks: a non-root user, a read-only root filesystem with no tmpfs, no
//! capabilities, the state dir on a named volume. It processes payments, answers 200 on
//! `/health/ready`, and a SIGTERM to its PID 1 commits and exits 0.
//!
//! Skipped, with the reason printed, where podman is missing or cannot run a container here
//! (scripts/image's exit code 3), and unless `TALLY_TEST_IMAGE=1`: a cold image build compiles
//! librdkafka and RocksDB again inside the build stage (README, "Container image").

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tally::demo::generator;

const TAG: &str = "localhost/tally:test";

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("podman runs")
}

/// `podman ARGS` that must succeed; its trimmed stdout.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Says why the test does nothing. Written to stderr directly: the test harness captures
/// `println!` and `eprintln!` of a passing test, and a skip must show in the suite's output.
fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "container_image: skipped: {reason}");
}

/// Removes the test's container and volume however the test ends.
struct Cleanup {
    container: String,
    volume: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.container]);
        let _ = podman(&["volume", "rm", "--force", &self.volume]);
    }
}

/// Builds the image with scripts/image; false (after printing why) where it cannot be built here.
fn build_image(log: &Path) -> bool {
    let started = Instant::now();
    let status = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image"))
        .arg(TAG)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("build log"))
        .status()
        .expect("scripts/image runs");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    if status.code() == Some(3) {
        skip(
            text.lines()
                .rev()
                .find(|l| l.starts_with("image:"))
                .unwrap_or("scripts/image exit code 3"),
        );
        return false;
    }
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    assert!(
        status.success(),
        "scripts/image failed ({status}); last lines:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    println!(
        "container_image: scripts/image built {TAG} in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    true
}

/// A field of /proc/PID/status, e.g. `Uid` or `NSpid`.
fn proc_status(pid: &str, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

#[test]
fn the_image_runs_tally_read_only_as_non_root_and_stops_cleanly_on_sigterm() {
    if std::env::var("TALLY_TEST_IMAGE").as_deref() != Ok("1") {
        skip(
            "set TALLY_TEST_IMAGE=1 to build the image and run it, or run scripts/test-image \
             (README, \"Container image\": a cold image build took 45 minutes here)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    if !build_image(&dir.path().join("image-build.log")) {
        return;
    }

    let names = Names::new("image");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    let gen = generator::payments(300, 50, 2048, 11);
    produce(&names.input, &gen.records);
    // The bootstrap address comes in through the environment, as the k8s Secret gives it.
    let topology = dir.path().join("topology.yaml");
    std::fs::write(
        &topology,
        format!(
            r#"
application_id: {app}
kafka:
  bootstrap_servers: ${{KAFKA_BOOTSTRAP}}
  properties: {{ session.timeout.ms: 6000, heartbeat.interval.ms: 1000 }}
processing: {{ commit_interval_ms: 100, max_record_bytes: 2048 }}
state: {{ dir: /var/lib/tally }}
sources:
  payments: {{ topic: {input} }}
pipelines:
  - name: payments
    from: payments
    repartition: {{ key: "{{payment_id}}" }}
    key: "{{payment_id}}:{{status}}"
    routes:
      - when: {{ event_type: "payment.*" }}
        strategy: ignore
    to: {{ topic: {output}, key: "{{payment_id}}" }}
dead_letter: {{ topic: {dlq} }}
"#,
            app = names.app,
            input = names.input,
            output = names.output,
            dlq = names.dlq,
        ),
    )
    .expect("write topology");

    let cleanup = Cleanup {
        container: names.app.clone(),
        volume: format!("{}-state", names.app),
    };
    podman_ok(&["volume", "create", &cleanup.volume]);
    let addr = free_address();
    let volume = format!("{}:/var/lib/tally", cleanup.volume);
    let topology_mount = format!("{}:/etc/tally/topology.yaml:ro", topology.display());
    let env = [
        format!("KAFKA_BOOTSTRAP={}", bootstrap()),
        "TALLY_INSTANCE_ID=image-1".to_string(),
        format!("TALLY_HTTP_ADDRESS={addr}"),
        "RUST_LOG=info,librdkafka=warn".to_string(),
    ];
    let mut args = vec![
        "run",
        "--detach",
        "--name",
        &cleanup.container,
        // The test broker listens on the host's loopback.
        "--network",
        "host",
        // No tmpfs either (podman adds /tmp, /var/tmp and /run by default): like
        // readOnlyRootFilesystem in Kubernetes, nothing but the volume is writable.
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--volume",
        &volume,
        "--volume",
        &topology_mount,
    ];
    for e in &env {
        args.extend(["--env", e.as_str()]);
    }
    args.extend([TAG, "--log-json", "run", "/etc/tally/topology.yaml"]);
    podman_ok(&args);
    let logs = || {
        let out = podman(&["logs", &cleanup.container]);
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout)
    };

    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let mut ready = None;
    while Instant::now() < deadline {
        ready = http_get(&addr, "/health/ready").map(|(code, _)| code);
        if ready == Some(200) {
            break;
        }
        let running = podman_ok(&["inspect", "--format", "{{.State.Running}}", &cleanup.container]);
        assert_eq!(running, "true", "the container stopped; its log:\n{}", logs());
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(ready, Some(200), "/health/ready within 120 s; log:\n{}", logs());
    println!(
        "container_image: /health/ready answered 200 {:.1} s after podman run",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(60)),
        gen.expected_keys.len(),
        "each payment out once; log:\n{}",
        logs()
    );

    // What runs: tally itself as PID 1 of the container, as uid 10001, on a read-only root.
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &cleanup.container]);
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    assert_eq!(comm.trim(), "tally");
    let nspid = proc_status(&pid, "NSpid");
    assert_eq!(
        nspid.split_whitespace().last(),
        Some("1"),
        "PID 1 in its namespace: {nspid}"
    );
    let uid = proc_status(&pid, "Uid");
    assert!(uid.split_whitespace().all(|u| u == "10001"), "runs as uid 10001: {uid}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).expect("mounts");
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"))
        .expect("a root mount");
    let options = root.split_whitespace().nth(3).unwrap_or("");
    assert!(options.split(',').any(|o| o == "ro"), "root is read-only: {root}");

    // SIGTERM, as `podman stop` and Kubernetes send it: commit, leave the group, exit 0.
    podman_ok(&["kill", "--signal", "TERM", &cleanup.container]);
    let signalled = Instant::now();
    let deadline = signalled + Duration::from_secs(60);
    let status = loop {
        let state = podman_ok(&[
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            &cleanup.container,
        ]);
        if state.starts_with("exited") || state.starts_with("stopped") {
            break state;
        }
        assert!(
            Instant::now() < deadline,
            "still {state} 60 s after SIGTERM; log:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        status.ends_with(" 0"),
        "exit code 0 after SIGTERM, got {status}; log:\n{}",
        logs()
    );
    println!(
        "container_image: SIGTERM to PID 1: {status} after {:.1} s",
        signalled.elapsed().as_secs_f64()
    );
    let log = logs();
    let lines: Vec<serde_json::Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let stopped = events(&lines, "tally stopped");
    assert_eq!(stopped.len(), 1, "one \"tally stopped\" line; log:\n{log}");
    assert_eq!(stopped[0]["records_in"], gen.records.len() as u64, "{}", stopped[0]);
    assert_eq!(
        stopped[0]["records_out"],
        gen.expected_keys.len() as u64,
        "{}",
        stopped[0]
    );

    // The state went to the volume, owned by the image's user.
    let mountpoint = podman_ok(&["volume", "inspect", "--format", "{{.Mountpoint}}", &cleanup.volume]);
    let app_dir = Path::new(&mountpoint).join(&names.app);
    assert!(app_dir.is_dir(), "{} holds the stores", app_dir.display());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&app_dir).expect("stat").uid(), 10001);
}

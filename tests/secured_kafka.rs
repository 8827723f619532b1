//! tally on a secured cluster (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer ACLs) that the test
//! starts itself with `TALLY_KAFKA_SECURE=1 deploy/local/kafka up`: exactly-once as a principal
//! holding only README.md's ACLs, refusals that name the fix (at start, in the one-shot
//! commands, and when an ACL goes while an instance runs), and no secret in any output.

mod common;

use common::*;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tally::demo::generator;

/// The secured cluster's script, jars and ports, stopped and wiped when dropped.
struct SecuredCluster {
    home: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
    bootstrap: String,
}

impl SecuredCluster {
    /// Starts a secured cluster in a home and on ports of its own; None (after saying why) when
    /// this machine lacks what it needs.
    fn start() -> Option<Self> {
        for tool in ["java", "keytool", "openssl"] {
            if !on_path(tool) {
                eprintln!("SKIPPED: `{tool}` is not installed, so the secured cluster cannot start (deploy/local/kafka with TALLY_KAFKA_SECURE=1 needs java, keytool and openssl)");
                return None;
            }
        }
        // The jars are kept between runs, apart from the test command's broker's.
        let libs = std::env::var("HOME")
            .map(|h| PathBuf::from(h).join(".cache/tally-kafka-jars"))
            .unwrap_or_else(|_| std::env::temp_dir().join("tally-kafka-jars"));
        if !libs.join(".complete").exists() && !on_path("mvn") {
            eprintln!(
                "SKIPPED: `mvn` is not installed and the Kafka jars are not in {}, so the secured cluster cannot start",
                libs.display()
            );
            return None;
        }
        let port = |addr: String| addr.rsplit(':').next().unwrap_or_default().to_string();
        let home = tempfile::tempdir().expect("tempdir for the cluster");
        let env = vec![
            ("TALLY_KAFKA_SECURE", "1".to_string()),
            ("TALLY_KAFKA_HOME", home.path().display().to_string()),
            ("TALLY_KAFKA_LIBS", libs.display().to_string()),
            ("TALLY_KAFKA_PORT", port(free_address())),
            ("TALLY_KAFKA_CONTROLLER_PORT", port(free_address())),
            ("TALLY_KAFKA_HEAP", "512m".to_string()),
        ];
        // Dropped (stopped and wiped) from here on, even when `up` fails half way.
        let mut cluster = Self {
            home,
            env,
            bootstrap: String::new(),
        };
        let t0 = Instant::now();
        let up = cluster.script(&["up"], None);
        assert!(
            up.status.success(),
            "the secured cluster did not start:\n{}",
            String::from_utf8_lossy(&up.stderr)
        );
        let stdout = String::from_utf8_lossy(&up.stdout);
        cluster.bootstrap = stdout.lines().last().unwrap_or_default().trim().to_string();
        eprintln!("secured cluster at {} after {:?}", cluster.bootstrap, t0.elapsed());
        Some(cluster)
    }

    /// Runs `deploy/local/kafka ARGS` for this cluster, with `stdin` as its input.
    fn script(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/kafka");
        let mut child = Command::new(script)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run deploy/local/kafka");
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            use std::io::Write;
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        child.wait_with_output().expect("deploy/local/kafka ends")
    }

    /// Runs AclCommand as the admin (several at once: each is a JVM start), failing on any error.
    fn acls(&self, commands: &[Vec<String>]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/kafka");
        let children: Vec<_> = commands
            .iter()
            .map(|args| {
                let child = Command::new(&script)
                    .arg("acl")
                    .args(args)
                    .envs(self.env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("run deploy/local/kafka acl");
                (args, child)
            })
            .collect();
        for (args, child) in children {
            let out = child.wait_with_output().expect("acl ends");
            assert!(
                out.status.success(),
                "acl {args:?} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn secure_file(&self, name: &str) -> PathBuf {
        self.home.path().join("secure").join(name)
    }

    /// The broker's and the controller's logs: each one's authorizer logs the denials of the
    /// requests it authorizes (the controller: CreateTopics and the like).
    fn logs(&self) -> String {
        ["logs/server.log", "controller/logs/server.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.home.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for SecuredCluster {
    fn drop(&mut self) {
        let down = self.script(&["down", "--wipe"], None);
        if !down.status.success() {
            eprintln!(
                "stopping the secured cluster failed:\n{}",
                String::from_utf8_lossy(&down.stderr)
            );
        }
    }
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The topics of one application, as README.md's ACL table sorts them.
struct App<'a> {
    app: &'a str,
    sources: Vec<&'a str>,
    /// Outputs, dead letters, trace, alerts.
    sinks: Vec<&'a str>,
    /// The trace topic, when the live reconciler reads it.
    reconciled: Option<&'a str>,
    /// The ID-mapping topic.
    mappings: Option<&'a str>,
}

/// `README.md`'s "Secured clusters" ACL table for `apps`, row by row, as AclCommand arguments
/// for `principal` (a row's resources of every app in one command: each is a JVM start).
fn readme_acls(principal: &str, apps: &[App<'_>]) -> Vec<Vec<String>> {
    let row = |ops: &[&str], flag: &str, names: Vec<String>, pattern: &str| -> Option<Vec<String>> {
        if names.is_empty() {
            return None;
        }
        let mut args = vec![
            "--add".to_string(),
            "--allow-principal".to_string(),
            principal.to_string(),
        ];
        for op in ops {
            args.extend(["--operation".to_string(), op.to_string()]);
        }
        for name in names {
            args.extend([flag.to_string(), name]);
        }
        args.extend(["--resource-pattern-type".to_string(), pattern.to_string()]);
        Some(args)
    };
    let each = |f: &dyn Fn(&App<'_>) -> Vec<String>| apps.iter().flat_map(f).collect::<Vec<String>>();
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    [
        // topic: each source | literal | Read, Describe
        row(
            &["Read", "Describe"],
            "--topic",
            each(&|a| owned(&a.sources)),
            "literal",
        ),
        // topic: each output, dead-letter, trace, alerts topic | literal | Write, Describe, DescribeConfigs
        row(
            &["Write", "Describe", "DescribeConfigs"],
            "--topic",
            each(&|a| owned(&a.sinks)),
            "literal",
        ),
        // topic: the trace topic, with `reconcile` | literal | Read
        row(
            &["Read"],
            "--topic",
            each(&|a| a.reconciled.map(String::from).into_iter().collect()),
            "literal",
        ),
        // topic: the ID-mapping topic | literal | Create, Read, Write, Describe, DescribeConfigs
        row(
            &["Create", "Read", "Write", "Describe", "DescribeConfigs"],
            "--topic",
            each(&|a| a.mappings.map(String::from).into_iter().collect()),
            "literal",
        ),
        // topic `<app>-` | prefixed | Create, Read, Write, Describe, DescribeConfigs, Delete
        row(
            &["Create", "Read", "Write", "Describe", "DescribeConfigs", "Delete"],
            "--topic",
            each(&|a| vec![format!("{}-", a.app)]),
            "prefixed",
        ),
        // group `<app>` | prefixed | Read, Describe
        row(
            &["Read", "Describe"],
            "--group",
            each(&|a| vec![a.app.to_string()]),
            "prefixed",
        ),
        // transactional id `<app>-` | prefixed | Write, Describe
        row(
            &["Write", "Describe"],
            "--transactional-id",
            each(&|a| vec![format!("{}-", a.app)]),
            "prefixed",
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The transactional-id row of the table for `app`, taken away.
fn remove_transactional_id_acl(principal: &str, app: &str) -> Vec<String> {
    let prefix = format!("{app}-");
    [
        "--remove",
        "--force",
        "--allow-principal",
        principal,
        "--operation",
        "Write",
        "--operation",
        "Describe",
        "--transactional-id",
        &prefix,
        "--resource-pattern-type",
        "prefixed",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The payments topology with its credentials from the environment, as README.md shows it.
const TOPOLOGY: &str = r#"
application_id: ${TALLY_APP_ID}
kafka:
  bootstrap_servers: ${KAFKA_BOOTSTRAP}
  properties:
    security.protocol: SASL_SSL
    sasl.mechanism: SCRAM-SHA-512
    sasl.username: ${KAFKA_USERNAME}
    sasl.password: "${KAFKA_PASSWORD}"
    ssl.ca.location: ${KAFKA_CA_LOCATION}
    session.timeout.ms: 6000
    heartbeat.interval.ms: 1000
processing: { commit_interval_ms: 100, max_record_bytes: 65536 }
state: { dir: "${TALLY_STATE_DIR}" }
sources:
  payments: { topic: "${TALLY_INPUT_TOPIC}" }
pipelines:
  - name: payments
    from: payments
    repartition: { key: "{payment_id}" }
    key: "{payment_id}:{status}"
    routes:
      - when: { event_type: "payment.*" }
        strategy: ignore
    to: { topic: "${TALLY_OUTPUT_TOPIC}", key: "{payment_id}" }
dead_letter: { topic: "${TALLY_DLQ_TOPIC}" }
"#;

/// Runs `tally ARGS` with `env`; its output.
fn tally(args: &[&str], env: &[(&str, String)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run tally")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits until the purge has deleted records below the committed offsets of `topic`: its low
/// watermark moves off 0 on some partition.
fn purged(topic: &str, timeout: Duration) -> bool {
    let (consumer, partitions) = committed_reader(topic, false);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let moved = (0..partitions as i32).any(|p| {
            use rdkafka::consumer::Consumer;
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .is_ok_and(|(low, _)| low > 0)
        });
        if moved {
            return true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    false
}

#[test]
fn tally_on_a_secured_cluster_with_only_the_readme_acls() {
    let Some(cluster) = SecuredCluster::start() else {
        return;
    };
    let admin_password = std::fs::read_to_string(cluster.secure_file("admin.password"))
        .expect("admin password")
        .trim()
        .to_string();
    let ca = cluster.secure_file("ca.pem").display().to_string();
    let admin = [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "admin"),
        ("sasl.password", admin_password.as_str()),
        ("ssl.ca.location", ca.as_str()),
    ];
    let admin: Vec<(String, String)> = admin.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    use_cluster(&cluster.bootstrap, &admin);

    let names = Names::new("secured");
    create_topics(&[(&names.input, 2), (&names.output, 2), (&names.dlq, 1)]);
    // Characters YAML and shells care about, and a tail no other text has.
    let nonce = now_ms();
    let password = format!(r#"Tq9#v: *w&{{x}}%"q\z-{nonce}"#);
    let wrong_password = format!("not-the-password-{nonce}");
    let user = cluster.script(&["user", "tally"], Some(&format!("{password}\n")));
    assert!(user.status.success(), "creating user tally: {}", text(&user));
    // A second application for the table's other rows: crm-to-erp.yaml's ID mappings (a topic
    // tally creates, reads and writes) and a live reconciler (which reads the trace topic).
    let mapped = Names::new("secured-map");
    create_topics(&[
        (&mapped.input, 2),
        (&mapped.writeback, 2),
        (&mapped.output, 2),
        (&mapped.dlq, 1),
        (&mapped.trace, 2),
        (&mapped.alerts, 1),
    ]);
    cluster.acls(&readme_acls(
        "User:tally",
        &[
            App {
                app: &names.app,
                sources: vec![&names.input],
                sinks: vec![&names.output, &names.dlq],
                reconciled: None,
                mappings: None,
            },
            App {
                app: &mapped.app,
                sources: vec![&mapped.input, &mapped.writeback],
                sinks: vec![&mapped.output, &mapped.dlq, &mapped.trace, &mapped.alerts],
                reconciled: Some(&mapped.trace),
                mappings: Some(&mapped.mappings),
            },
        ],
    ));

    let dir = tempfile::tempdir().expect("tempdir");
    let credentials = |password: &str| {
        vec![
            ("KAFKA_USERNAME", "tally".to_string()),
            ("KAFKA_PASSWORD", password.to_string()),
            ("KAFKA_CA_LOCATION", ca.clone()),
        ]
    };
    // Every output of tally's, searched for the secrets at the end.
    let mut outputs: Vec<(String, String)> = Vec::new();

    // Exactly-once as the least-privileged principal. The input comes in two halves, the second
    // after the purge interval (30 s), so the purge of the repartition topic (Delete) runs too.
    let gen = generator::payments(400, 0, 0, 31);
    let half = gen.records.len() / 2;
    produce(&names.input, &gen.records[..half]);
    let first = Tally::start_yaml_with(TOPOLOGY, &names, dir.path(), "i1", &credentials(&password));
    // The purge clock starts with the stream thread's clients, before its first task is ready.
    let deadline = Instant::now() + Duration::from_secs(60);
    while events(&first.lines(), "task ready").is_empty() {
        assert!(
            Instant::now() < deadline,
            "no task ready within 60 s:\n{}",
            std::fs::read_to_string(first.log()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let purge_due = Instant::now() + Duration::from_secs(31);

    // Meanwhile: a wrong password stops an instance at once, naming the settings to fix.
    let t0 = Instant::now();
    let mut wrong = Tally::start_yaml_with(TOPOLOGY, &names, dir.path(), "wrong", &credentials(&wrong_password));
    let status = wrong.exit_within(Duration::from_secs(30));
    let took = t0.elapsed();
    let log = std::fs::read_to_string(wrong.log()).expect("log");
    let status = status.unwrap_or_else(|| panic!("a wrong password did not stop tally within 30 s:\n{log}"));
    assert!(!status.success(), "{status}");
    assert!(
        log.contains("rejected the credentials")
            && log.contains("`sasl.password`")
            && log.contains("`kafka.properties`"),
        "names the settings to fix:\n{log}"
    );
    eprintln!("wrong password: {status} after {took:?}");
    outputs.push(("wrong-password run".into(), log));

    // validate and describe see the credentials and show none.
    let topology_file = dir.path().join("i1.yaml");
    let env: Vec<(&str, String)> = [("KAFKA_BOOTSTRAP", cluster.bootstrap.clone())]
        .into_iter()
        .chain(credentials(&password))
        .chain([
            ("TALLY_APP_ID", names.app.clone()),
            ("TALLY_STATE_DIR", dir.path().join("state-x").display().to_string()),
            ("TALLY_INPUT_TOPIC", names.input.clone()),
            ("TALLY_OUTPUT_TOPIC", names.output.clone()),
            ("TALLY_DLQ_TOPIC", names.dlq.clone()),
        ])
        .collect();
    let file = topology_file.display().to_string();
    for args in [vec!["validate", file.as_str()], vec!["describe", file.as_str()]] {
        let out = tally(&args, &env);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        outputs.push((format!("tally {}", args[0]), text(&out)));
    }
    // The one-shot commands check the login before their first request too: a wrong password
    // fails fast with the fix, rather than as a cluster that never answers.
    let wrong_env: Vec<(&str, String)> = env
        .iter()
        .map(|(k, v)| match *k {
            "KAFKA_PASSWORD" => (*k, wrong_password.clone()),
            _ => (*k, v.clone()),
        })
        .collect();
    let one_shots = [
        vec!["inspect", file.as_str(), "--key", "PAY-1:PAID"],
        vec!["redrive", file.as_str(), "--dry-run"],
        vec!["reset", file.as_str()],
        vec![
            "reconcile",
            "ack",
            file.as_str(),
            "--event-id",
            "e-1",
            "--reason",
            "test",
        ],
    ];
    std::thread::scope(|scope| {
        let runs: Vec<_> = one_shots
            .iter()
            .map(|args| {
                let env = &wrong_env;
                scope.spawn(move || {
                    let t0 = Instant::now();
                    let out = tally(args, env);
                    (args, out, t0.elapsed())
                })
            })
            .collect();
        for run in runs {
            let (args, out, took) = run.join().expect("the command's thread");
            let said = text(&out);
            assert!(!out.status.success(), "{args:?} with a wrong password: {said}");
            assert!(
                said.contains("rejected the credentials")
                    && said.contains("`sasl.password`")
                    && said.contains("`kafka.properties` of"),
                "{args:?} names the settings to fix: {said}"
            );
            assert!(took < Duration::from_secs(15), "{args:?} took {took:?}: {said}");
            // `reconcile ack` is two words; the others' second is the file.
            let command = if args[0] == "reconcile" {
                args[..2].join(" ")
            } else {
                args[0].to_string()
            };
            eprintln!("tally {command} with a wrong password: {} after {took:?}", out.status);
            outputs.push((format!("tally {command} (wrong password)"), said));
        }
    });
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        TOPOLOGY.replace("    session.timeout.ms", "    group.id: x\n    session.timeout.ms"),
    )
    .expect("write");
    let out = tally(&["validate", &broken.display().to_string()], &env);
    assert!(
        !out.status.success() && text(&out).contains("group.id"),
        "refused: {}",
        text(&out)
    );
    outputs.push(("tally validate (refused)".into(), text(&out)));

    // Meanwhile too: the ID-mapping and reconciler rows, on crm-to-erp.yaml made secure.
    let example = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/crm-to-erp.yaml"))
        .expect("example");
    let secured_example = example.replace(
        "  bootstrap_servers: ${KAFKA_BOOTSTRAP:-127.0.0.1:9092}\n",
        &format!(
            "{}trace: {{ topic: \"${{TALLY_TRACE_TOPIC}}\" }}\nreconcile: {{ alerts_topic: \"${{TALLY_ALERTS_TOPIC}}\" }}\n",
            &TOPOLOGY[TOPOLOGY.find("  bootstrap_servers").expect("kafka section")..TOPOLOGY.find("processing:").expect("processing")]
        ),
    );
    assert_ne!(
        secured_example, example,
        "the example's kafka section is where the test expects it"
    );
    let http = free_address();
    let mut env = credentials(&password);
    env.push(("TALLY_HTTP_ADDRESS", http.clone()));
    let mapping = Tally::start_yaml_with(&secured_example, &mapped, dir.path(), "m1", &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(&http, "/health/ready").map(|(status, _)| status) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "crm-to-erp never got ready with the README's ACLs:\n{}",
            std::fs::read_to_string(mapping.log()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The mappings topic is tailed and the trace topic consumed for a while before the check.
    std::thread::sleep(Duration::from_secs(3));
    mapping.stop();
    outputs.push((
        "instance m1".into(),
        std::fs::read_to_string(dir.path().join("m1.log")).expect("log"),
    ));

    std::thread::sleep(purge_due.saturating_duration_since(Instant::now()));
    produce(&names.input, &gen.records[half..]);
    let got = wait_for_count(&names.output, gen.expected_keys.len(), Duration::from_secs(120));
    assert_eq!(got, gen.expected_keys.len(), "output count before stop");
    let repartition = format!("{}-payments-repartition", names.app);
    assert!(
        purged(&repartition, Duration::from_secs(30)),
        "the purge of {repartition} (DeleteRecords, the Delete ACL) never happened"
    );
    let lines = first.stop();
    outputs.push((
        "instance i1".into(),
        std::fs::read_to_string(dir.path().join("i1.log")).expect("log"),
    ));
    let stopped = events(&lines, "tally stopped");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0]["records_in"], gen.records.len() as u64);

    let output = read_committed(&names.output, gen.expected_keys.len(), Duration::from_secs(30));
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in &output {
        *seen.entry(business_key(m)).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "duplicates on the output, e.g. {twice:?}");
    let expected: BTreeSet<&String> = gen.expected_keys.iter().collect();
    let got: BTreeSet<&String> = seen.keys().collect();
    assert_eq!(got, expected, "every input comes out, and nothing else");
    assert_eq!(output.len(), gen.expected_keys.len());

    // The table was enough: the authorizer denied tally nothing (and it logs every denial, as
    // the missing ACL below shows).
    let denied = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("Principal = User:tally is Denied"))
            .map(str::to_string)
            .collect()
    };
    let denials = denied(&cluster.logs());
    assert!(denials.is_empty(), "the README's ACLs are not enough: {denials:#?}");

    // A missing ACL: without the transactional ids, an instance stops with exit 1 and the fix.
    cluster.acls(&[remove_transactional_id_acl("User:tally", &names.app)]);
    let mut second = Tally::start_yaml_with(TOPOLOGY, &names, dir.path(), "i2", &credentials(&password));
    let status = second.exit_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(second.log()).expect("log");
    let status = status.unwrap_or_else(|| panic!("a missing ACL did not stop tally within 60 s:\n{log}"));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("Write and Describe on the transactional ids prefixed"),
        "names the ACL to grant:\n{log}"
    );
    let denials = denied(&cluster.logs());
    assert!(
        !denials.is_empty() && denials.iter().all(|d| d.contains("TransactionalId")),
        "the broker denied the transactional id and nothing else: {denials:#?}"
    );
    outputs.push(("instance i2 (missing ACL)".into(), log));

    // An ACL taken away while an instance runs: its ID-mapping reader, tailing the mappings
    // topic, is refused and stops the instance with the fix, instead of warning forever.
    let http = free_address();
    let mut env = credentials(&password);
    env.push(("TALLY_HTTP_ADDRESS", http.clone()));
    let mut tailing = Tally::start_yaml_with(&secured_example, &mapped, dir.path(), "m2", &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(&http, "/health/ready").map(|(status, _)| status) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "crm-to-erp never got ready again:\n{}",
            std::fs::read_to_string(tailing.log()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    cluster.acls(&[vec![
        "--remove".to_string(),
        "--force".to_string(),
        "--allow-principal".to_string(),
        "User:tally".to_string(),
        "--operation".to_string(),
        "Read".to_string(),
        "--topic".to_string(),
        mapped.mappings.clone(),
    ]]);
    let status = tailing.exit_within(Duration::from_secs(60));
    let log = std::fs::read_to_string(tailing.log()).expect("log");
    let status =
        status.unwrap_or_else(|| panic!("losing Read on the mappings topic did not stop tally within 60 s:\n{log}"));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("reading the mappings topic `{}`", mapped.mappings))
            && log.contains("Create, Read, Write, Describe and DescribeConfigs on the ID-mapping topic")
            && log.contains("restarting it changes nothing until that is done")
            && !log.contains("a supervisor should restart it"),
        "names the ACL to grant, and no restart as the cure:\n{log}"
    );
    outputs.push(("instance m2 (Read on the mappings topic taken away)".into(), log));

    // tally reconcile offline takes the credentials from a file or the environment.
    let properties = dir.path().join("reconcile.properties");
    std::fs::write(
        &properties,
        format!(
            "# the reader's login\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
             sasl.username=admin\nsasl.password={admin_password}\nssl.ca.location={ca}\n"
        ),
    )
    .expect("write properties");
    let sent = format!("topic:{}", names.input);
    let reconcile = |extra: &[&str], env: &[(&str, String)]| -> Output {
        let mut args = vec![
            "reconcile",
            "offline",
            "--sent",
            sent.as_str(),
            "--sent-key",
            "{payment_id}:{status}",
            "--processed",
            names.output.as_str(),
            "--bootstrap",
            cluster.bootstrap.as_str(),
            "--no-progress",
        ];
        args.extend_from_slice(extra);
        // What `ps` would show: never a password.
        assert!(
            !args
                .iter()
                .any(|a| a.contains(&admin_password) || a.contains(&password)),
            "{args:?}"
        );
        tally(&args, env)
    };
    let file_arg = properties.display().to_string();
    let from_file = reconcile(&["--kafka-properties-file", &file_arg], &[]);
    assert!(
        from_file.status.success() && text(&from_file).contains("result     OK"),
        "{}",
        text(&from_file)
    );
    outputs.push(("reconcile (file)".into(), text(&from_file)));
    let ca_arg = format!("ssl.ca.location={ca}");
    let from_env = reconcile(
        &[
            "--kafka-property",
            "security.protocol=SASL_SSL",
            "--kafka-property",
            "sasl.mechanism=SCRAM-SHA-512",
            "--kafka-property",
            "sasl.username=admin",
            "--kafka-property",
            "sasl.password=${RECONCILE_PASSWORD}",
            "--kafka-property",
            &ca_arg,
        ],
        &[("RECONCILE_PASSWORD", admin_password.clone())],
    );
    assert!(
        from_env.status.success() && text(&from_env).contains("result     OK"),
        "{}",
        text(&from_env)
    );
    outputs.push(("reconcile (environment)".into(), text(&from_env)));
    let wrong_file = dir.path().join("wrong.properties");
    std::fs::write(
        &wrong_file,
        std::fs::read_to_string(&properties)
            .expect("read")
            .replace(&admin_password, &wrong_password),
    )
    .expect("write");
    let t0 = Instant::now();
    let rejected = reconcile(&["--kafka-properties-file", &wrong_file.display().to_string()], &[]);
    assert_eq!(rejected.status.code(), Some(2), "{}", text(&rejected));
    assert!(
        text(&rejected).contains("rejected the credentials") && text(&rejected).contains("--kafka-properties-file"),
        "{}",
        text(&rejected)
    );
    eprintln!("reconcile with a wrong password: exit 2 after {:?}", t0.elapsed());
    outputs.push(("reconcile (wrong password)".into(), text(&rejected)));
    // A literal secret on the command line is refused before anything connects. (This one is
    // on this test's command line, but it is wrong anyway.)
    let literal = format!("sasl.password={wrong_password}");
    let out = tally(
        &[
            "reconcile",
            "offline",
            "--sent",
            &sent,
            "--processed",
            &names.output,
            "--bootstrap",
            &cluster.bootstrap,
            "--kafka-property",
            &literal,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--kafka-properties-file"), "{}", text(&out));
    outputs.push(("reconcile (literal secret)".into(), text(&out)));

    // No secret anywhere: tally's logs, describe, validate, errors; nor the cluster's logs.
    outputs.push(("broker and controller logs".into(), cluster.logs()));
    for (what, text) in &outputs {
        for (secret, name) in [
            (&password, "tally's password"),
            (&wrong_password, "the wrong password"),
            (&admin_password, "the admin's password"),
        ] {
            assert!(!text.contains(secret.as_str()), "{name} appears in the {what}:\n{text}");
        }
    }
    // The admin tool's argument files held passwords; none is left behind.
    let left: Vec<_> = std::fs::read_dir(cluster.home.path().join("secure"))
        .expect("secure dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("args."))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "argument files left: {left:?}");
}

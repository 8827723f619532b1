//! `tally reconcile`: compares what upstream says it sent with what tally processed.
//!
//! Exit codes, like diff(1): 0 nothing missing, 1 anomalies that fail the run (missing keys,
//! unreadable sent records; with `--strict` also ghosts, duplicates and unreadable processed
//! records), 2 the reconciliation could not run (arguments, files, Kafka).

use crate::config::interpolate::interpolate_plain;
use crate::engine::credentials;
use crate::reconcile::files::FileFormat;
use crate::reconcile::offline::{self, Options, ProcessedKind, SentSource};
use crate::reconcile::report_file::ReportFormat;
use crate::reconcile::sent_key::SentKey;
use crate::reconcile::topic;
use crate::reconcile::window::{parse_time, Window};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code when the reconciliation found what fails it.
pub const EXIT_FAILED: u8 = 1;
/// Exit code when the reconciliation could not run.
pub const EXIT_ERROR: u8 = 2;
/// How long the reconciliation waits for the cluster to answer before it gives up.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Arguments of `tally reconcile offline`.
#[derive(Debug, clap::Args)]
pub struct OfflineArgs {
    /// What upstream says it sent: a JSON Lines, JSON array or CSV file, or `topic:<name>` (key
    /// from the `tally.idempotency_key` header, else from the JSON value as below).
    #[arg(long, value_name = "FILE|topic:NAME")]
    pub sent: String,
    /// Layout of the --sent file when its extension (.jsonl, .ndjson, .json, .csv) does not say.
    #[arg(long, value_enum)]
    pub sent_format: Option<FileFormat>,
    /// JSON field or CSV column that holds the idempotency key of sent records.
    #[arg(long, default_value = "idempotency_key")]
    pub sent_field: String,
    /// Build the key of sent records from their fields or columns with the pipeline's key
    /// template, e.g. `{payment_id}:{status}` (for an export that has no key column); rendered
    /// as tally renders it. Replaces --sent-field.
    #[arg(long, value_name = "TEMPLATE", conflicts_with = "sent_field")]
    pub sent_key: Option<String>,
    /// Reconcile one period: sent records from this time (RFC 3339, e.g. 2026-12-03T00:00:00Z,
    /// or epoch milliseconds); needs --to.
    #[arg(long, value_name = "TIME", requires = "to")]
    pub from: Option<String>,
    /// End of the period (exclusive): sent records before this time; needs --from.
    #[arg(long, value_name = "TIME", requires = "from")]
    pub to: Option<String>,
    /// With --from/--to: processed records count from --from until this long after --to (an
    /// event sent just before --to is processed a little after it).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    pub grace: std::time::Duration,
    /// With --from/--to and a sent file: the JSON field or CSV column of each record's time
    /// (epoch milliseconds or RFC 3339). Topic records use their timestamp.
    #[arg(long, value_name = "FIELD", requires = "from")]
    pub sent_time_field: Option<String>,
    /// The topic of what was processed: a pipeline's output topic (or a trace topic, see
    /// --processed-kind).
    #[arg(long, value_name = "TOPIC")]
    pub processed: String,
    /// What --processed holds: outputs (header `tally.idempotency_key`) or tally.trace/v1
    /// records (emitting COMPLETED records count).
    #[arg(long, value_enum, default_value = "output")]
    pub processed_kind: ProcessedKind,
    /// With --processed-kind trace: count only this node's records (`<application_id>/<pipeline>`).
    #[arg(long, value_name = "NODE")]
    pub trace_node: Option<String>,
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    pub bootstrap: String,
    /// librdkafka properties for the consumers (TLS, SASL, …) from a file of KEY=VALUE lines
    /// (`#` starts a comment): the place for secrets, which a command line shows to everyone
    /// on the host (`ps`).
    #[arg(long, value_name = "PATH", env = "TALLY_KAFKA_PROPERTIES_FILE")]
    pub kafka_properties_file: Option<PathBuf>,
    /// A librdkafka property for the consumers (TLS, SASL, …) as KEY=VALUE; repeatable; wins
    /// over the file. `${VAR}` in VALUE is read from the environment; a secret
    /// (`sasl.password`, `ssl.key.password`, …) must come that way
    /// (`--kafka-property 'sasl.password=${KAFKA_PASSWORD}'`) or from the file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub kafka_properties: Vec<(String, String)>,
    /// Write every anomaly to this file.
    #[arg(long, value_name = "PATH")]
    pub report: Option<PathBuf>,
    /// Layout of the report: JSON Lines (one object per anomaly, then a summary object) or CSV
    /// (`kind,idempotency_key,count,detail`). Default: csv for a .csv path, else json.
    #[arg(long, value_enum, requires = "report")]
    pub report_format: Option<ReportFormat>,
    /// Examples of each anomaly shown in the summary.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub examples: usize,
    /// Fail (exit 1) on ghosts, duplicates and unreadable processed records too, not only on
    /// missing keys and unreadable sent records.
    #[arg(long)]
    pub strict: bool,
    /// Directory for the temporary work database (default: the system's temporary directory);
    /// it needs disk space for every key and its counts.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// No progress line on stderr, even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
}

/// Runs `tally reconcile offline`: prints the summary on stdout, writes the report, and returns
/// the exit code.
pub fn offline(args: &OfflineArgs) -> ExitCode {
    match run_offline(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_FAILED),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run_offline(args: &OfflineArgs) -> Result<bool> {
    let opts = options(args)?;
    // A wrong password would otherwise read as an unreachable broker.
    credentials::probe(
        &opts.kafka,
        "--kafka-properties-file or --kafka-property",
        PROBE_TIMEOUT,
    )?;
    let findings = offline::run(&opts)?;
    print!("{}", findings.render(&opts.sent.describe(), &opts.describe_processed()));
    let failures = offline::failures(&findings.summary, args.strict);
    if let Some((path, _)) = &opts.report {
        println!("report     {}", path.display());
    }
    if failures.is_empty() {
        println!("result     OK: nothing missing");
    } else {
        println!("result     FAILED: {}", failures.join(", "));
    }
    Ok(failures.is_empty())
}

fn options(args: &OfflineArgs) -> Result<Options> {
    if args.trace_node.is_some() && args.processed_kind != ProcessedKind::Trace {
        bail!("--trace-node applies to --processed-kind trace");
    }
    let report = args.report.as_ref().map(|path| {
        let format = args.report_format.unwrap_or(if is_csv(path) {
            ReportFormat::Csv
        } else {
            ReportFormat::Json
        });
        (path.clone(), format)
    });
    let sent = SentSource::parse(&args.sent, args.sent_format)?;
    Ok(Options {
        window: window(args, &sent)?,
        sent,
        sent_key: SentKey::parse(&args.sent_field, args.sent_key.as_deref())?,
        processed: args.processed.clone(),
        processed_kind: args.processed_kind,
        trace_node: args.trace_node.clone(),
        kafka: topic::client_config(
            &args.bootstrap,
            &kafka_properties(args.kafka_properties_file.as_deref(), &args.kafka_properties, |var| {
                std::env::var(var).ok()
            })?,
        )?,
        report,
        examples: args.examples,
        work_dir: args.work_dir.clone(),
        progress: !args.no_progress,
    })
}

/// The period of `--from`/`--to`, checked against the sent source.
fn window(args: &OfflineArgs, sent: &SentSource) -> Result<Option<Window>> {
    let (Some(from), Some(to)) = (&args.from, &args.to) else {
        return Ok(None);
    };
    let from_ms = parse_time(from).map_err(|e| anyhow!("--from: {e}"))?;
    let to_ms = parse_time(to).map_err(|e| anyhow!("--to: {e}"))?;
    if to_ms <= from_ms {
        bail!("--to `{to}` is not after --from `{from}`");
    }
    if matches!(sent, SentSource::File { .. }) && args.sent_time_field.is_none() {
        bail!("--from/--to with a sent file needs --sent-time-field: the field or column of each record's time");
    }
    Ok(Some(Window {
        from_ms,
        to_ms,
        grace_ms: i64::try_from(args.grace.as_millis()).unwrap_or(i64::MAX),
        sent_time_field: args.sent_time_field.clone(),
    }))
}

fn is_csv(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

fn parse_property(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        // Never the value: it may be a secret.
        Some(_) => Err("the key before `=` is empty; write KEY=VALUE".to_string()),
        None => Err(format!("`{text}` has no `=`; write KEY=VALUE")),
    }
}

/// The consumers' librdkafka properties: those of `file`, then `args` (whose `${VAR}`s `env`
/// resolves). A secret written out in `args` is refused: the command line is visible in `ps`.
/// No message repeats a value.
fn kafka_properties(
    file: Option<&Path>,
    args: &[(String, String)],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>> {
    let mut properties = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --kafka-properties-file {}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => properties.push((k.trim().to_string(), v.trim().to_string())),
                _ => bail!(
                    "--kafka-properties-file {} line {}: not KEY=VALUE (a comment line starts with `#`)",
                    path.display(),
                    n + 1
                ),
            }
        }
    }
    for (key, value) in args {
        // Exactly one variable, no default: a default would be a secret on the command line.
        let one_variable = value
            .strip_prefix("${")
            .and_then(|v| v.strip_suffix('}'))
            .is_some_and(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if credentials::is_secret(key) && !one_variable {
            bail!(
                "--kafka-property `{key}` is a secret, and a command line is visible to everyone on the host \
                 (`ps`); put it in --kafka-properties-file, or in an environment variable written as \
                 --kafka-property '{key}=${{VARIABLE}}'"
            );
        }
        let (resolved, problems) = interpolate_plain(value, &env);
        if let Some(p) = problems.first() {
            bail!("--kafka-property `{key}`: {}", p.message);
        }
        properties.push((key.clone(), resolved));
    }
    Ok(properties)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "KAFKA_PASSWORD").then(|| "s3cr3t".to_string())
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn secrets_come_from_the_file_or_the_environment_and_the_command_line_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("client.properties");
        std::fs::write(
            &file,
            "# the reader's login\nsecurity.protocol=SASL_SSL\n\nsasl.password = from-file \nsasl.username=a=b\n",
        )
        .expect("write");
        let got = kafka_properties(Some(&file), &[pair("sasl.username", "tally")], env).expect("properties");
        assert_eq!(
            got,
            vec![
                pair("security.protocol", "SASL_SSL"),
                pair("sasl.password", "from-file"),
                pair("sasl.username", "a=b"),
                pair("sasl.username", "tally"),
            ]
        );
        let got = kafka_properties(None, &[pair("sasl.password", "${KAFKA_PASSWORD}")], env).expect("from env");
        assert_eq!(got, vec![pair("sasl.password", "s3cr3t")]);
    }

    #[test]
    fn a_secret_on_the_command_line_is_refused_without_repeating_it() {
        let err = kafka_properties(None, &[pair("sasl.password", "hunter2")], env).expect_err("refused");
        let text = format!("{err:#}");
        assert!(
            text.contains("--kafka-properties-file") && text.contains("${VARIABLE}"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        let err = kafka_properties(None, &[pair("sasl.password", "${NOPE:-hunter2}")], env).expect_err("default");
        assert!(!format!("{err:#}").contains("hunter2"), "{err:#}");
        let err = kafka_properties(None, &[pair("sasl.password", "${UNSET_VAR}")], env).expect_err("unset");
        assert!(format!("{err:#}").contains("`UNSET_VAR`"), "{err:#}");
        let err = parse_property("=hunter2").expect_err("no key");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn a_malformed_file_line_is_named_by_number_not_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("client.properties");
        std::fs::write(&file, "security.protocol=SASL_SSL\nhunter2\n").expect("write");
        let err = kafka_properties(Some(&file), &[], env).expect_err("malformed");
        let text = format!("{err:#}");
        assert!(text.contains("line 2") && !text.contains("hunter2"), "{text}");
    }
}

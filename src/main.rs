//! The `tally` command line: parses arguments and calls the library.

mod allocator;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tally::commands;
use tally::engine::routing::OnChange;

/// Exactly-once deduplication of Kafka integration events by business idempotency key.
#[derive(Parser)]
#[command(name = "tally", version, about, long_about = None)]
struct Cli {
    /// Log lines as JSON objects instead of text (stderr either way; filter with RUST_LOG).
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a topology as one instance of its consumer group, until SIGTERM or Ctrl-C.
    Run {
        /// The topology YAML file.
        topology: PathBuf,
        /// Stable id of this instance; part of its transactional id, so keep it across restarts.
        #[arg(long, env = "TALLY_INSTANCE_ID")]
        instance_id: Option<String>,
        /// Serve /metrics, /health/live and /health/ready on this address (e.g. 127.0.0.1:9464).
        #[arg(long, env = "TALLY_HTTP_ADDRESS")]
        http_address: Option<std::net::SocketAddr>,
        /// Start even though a pipeline routes records to tasks differently than when its state
        /// was built (copies of events processed before may pass once more); stop every
        /// instance first.
        #[arg(long)]
        accept_routing_change: bool,
    },
    /// Check topology files and list every problem with its line and column.
    Validate {
        /// Topology YAML files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a topology: sources, steps, sinks, stores and their changelog topics.
    Describe {
        /// The topology YAML file.
        topology: PathBuf,
        /// Output: text, or a graph of topics, steps and stores (mermaid, dot).
        #[arg(long, value_enum, default_value_t)]
        format: commands::describe::Format,
    },
    /// Start an application over, like kafka-streams-application-reset: delete its group
    /// offsets, internal topics and this host's state (refused while an instance runs). Prints
    /// the plan; --execute carries it out.
    Reset(commands::reset::ResetArgs),
    /// Print the JSON Schema of topology files (for editors; `tally validate` checks the rest).
    Schema,
    /// Run the payments topology on an in-process mock Kafka (no broker needed; not exactly-once).
    Demo {
        /// Distinct payment events to generate (each is sent 1-5 times).
        #[arg(long, default_value_t = 2000)]
        events: usize,
        /// Seed of the generator.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Send dead letters back to their source topic (after fixing their cause), each exactly
    /// once: a second run skips what the first sent. Exit 2 when some cannot be sent.
    Redrive(commands::redrive::RedriveArgs),
    /// Show every trace record, output and dead letter of one event, by idempotency key or
    /// correlation id, oldest first: where it went and where it stopped. Exit 2 when none.
    Inspect(commands::inspect::InspectArgs),
    /// Reconcile: live, as its own deployment, or offline, what upstream says it sent against
    /// what tally processed.
    Reconcile {
        // Boxed: the offline arguments would make every command's value as large as theirs.
        #[command(subcommand)]
        mode: Box<Reconcile>,
    },
}

#[derive(Subcommand)]
enum Reconcile {
    /// Run the live reconciler of a topology with `reconcile.run: separately` as its own
    /// application (group `<application_id>-reconcile`): alerts on events on the trace topic
    /// open past the threshold and on records of tally's inputs that tally has not consumed
    /// while their partition stood still for the threshold, until SIGTERM or Ctrl-C.
    Live {
        /// The topology YAML file (the same as tally's instances run).
        topology: PathBuf,
        /// Stable id of this reconciler instance; part of its transactional id.
        #[arg(long, env = "TALLY_INSTANCE_ID")]
        instance_id: Option<String>,
        /// Serve /metrics, /health/live and /health/ready on this address.
        #[arg(long, env = "TALLY_HTTP_ADDRESS")]
        http_address: Option<std::net::SocketAddr>,
        /// Start even though trace records are routed to tasks differently than when the
        /// reconciler's state was built (events open across the change may be alerted as stuck).
        #[arg(long)]
        accept_routing_change: bool,
    },
    /// Close failed (dead-lettered) or stuck events that will not be redriven, with a reason
    /// that is recorded on the trace topic next to the event's other records.
    Ack(commands::acknowledge::AckArgs),
    /// Report missing, ghost and duplicate keys between a sent file or topic and a processed
    /// topic; exit 0 when nothing is missing, 1 when it fails, 2 when it cannot run.
    Offline(Box<commands::reconcile::OfflineArgs>),
}

fn main() -> ExitCode {
    allocator::configure();
    let cli = Cli::parse();
    // The demo prints a report; its per-record log lines would drown it.
    let filter = match cli.command {
        Command::Demo { .. } => "error",
        _ => commands::logging::DEFAULT_FILTER,
    };
    commands::logging::init(cli.log_json, filter);
    let result = match cli.command {
        // Its own exit codes: 1 means anomalies, 2 that it could not run.
        Command::Reconcile { mode } => match *mode {
            Reconcile::Offline(args) => return commands::reconcile::offline(&args),
            Reconcile::Ack(args) => commands::acknowledge::ack(&args),
            Reconcile::Live {
                topology,
                instance_id,
                http_address,
                accept_routing_change,
            } => {
                let id = instance_id.unwrap_or_else(commands::run::default_instance_id);
                commands::run::reconcile_live(&topology, &id, http_address, on_change(accept_routing_change))
                    .map(|()| true)
            }
        },
        Command::Run {
            topology,
            instance_id,
            http_address,
            accept_routing_change,
        } => {
            let id = instance_id.unwrap_or_else(commands::run::default_instance_id);
            commands::run::run(&topology, &id, http_address, on_change(accept_routing_change)).map(|()| true)
        }
        Command::Validate { files } => Ok(commands::validate::validate(&files)),
        Command::Schema => {
            print!("{}", tally::config::schema::topology_schema());
            Ok(true)
        }
        Command::Redrive(args) => commands::redrive::redrive(&args),
        Command::Inspect(args) => commands::inspect::inspect(&args),
        Command::Reset(args) => commands::reset::reset(&args),
        Command::Describe { topology, format } => commands::describe::describe_file(&topology, format)
            .map(|text| print!("{text}"))
            .map(|()| true)
            .map_err(anyhow::Error::new),
        Command::Demo { events, seed } => tally::demo::run(events, seed).map(|r| {
            print!("{}", tally::demo::render(&r));
            true
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What `--accept-routing-change` asks for.
fn on_change(accept: bool) -> OnChange {
    if accept {
        OnChange::Accept
    } else {
        OnChange::Refuse
    }
}

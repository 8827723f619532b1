//! The one place Kafka errors are classified, as librdkafka defines them, and the domains of
//! the errors that end a stream thread's generation, each with what the thread does next.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// What the engine does about a Kafka error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try the same call again.
    Retriable,
    /// Abort the transaction, rewind to the committed offsets, drop uncommitted store writes.
    Abortable,
    /// Another instance owns the tasks now: close them and rejoin the group.
    Fenced,
    /// The cluster refuses this principal (authentication, a missing ACL): no retry or rejoin
    /// can succeed until an operator changes something, so the instance stops and says what.
    Refused,
    /// The client is unusable: rebuild the stream thread's clients after a backoff.
    Fatal,
}

/// The librdkafka error code `err` carries. rdkafka's own `rdkafka_error_code` gives none for
/// an admin operation's error, which has one: without it a broker that dropped the connection
/// while tally read its topics' configuration at start looked like an unknown failure, and the
/// instance exited instead of waiting (a chaos run caught it).
pub fn code(err: &KafkaError) -> Option<RDKafkaErrorCode> {
    match err {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    }
}

/// Classifies an error from a producer, consumer, admin or transaction call.
pub fn classify(err: &KafkaError) -> ErrorClass {
    if code(err).is_some_and(|code| is_fencing(code) || is_stale_membership(code)) {
        return ErrorClass::Fenced;
    }
    if code(err).is_some_and(is_refusal) {
        return ErrorClass::Refused;
    }
    if let KafkaError::Transaction(e) = err {
        if e.is_fatal() {
            return ErrorClass::Fatal;
        }
        if e.txn_requires_abort() {
            return ErrorClass::Abortable;
        }
        if e.is_retriable() {
            return ErrorClass::Retriable;
        }
    }
    match code(err) {
        Some(
            RDKafkaErrorCode::QueueFull
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::CoordinatorNotAvailable
            | RDKafkaErrorCode::CoordinatorLoadInProgress
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::ConcurrentTransactions,
        ) => ErrorClass::Retriable,
        Some(
            RDKafkaErrorCode::RebalanceInProgress
            | RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidRecord
            // A produce refused because the transaction hit an abortable error (a fatal error
            // is reported as `Fatal` by librdkafka).
            | RDKafkaErrorCode::State,
        ) => ErrorClass::Abortable,
        _ => ErrorClass::Fatal,
    }
}

/// Producer fencing and epoch errors only, as Kafka Streams' `StreamsProducer` maps them: a
/// missing ACL is not a migration (rejoining would only loop), it is fatal.
fn is_fencing(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::FencedInstanceId
    )
}

/// Authentication and authorization failures: Kafka Streams stops on them too (its
/// `StreamsProducer` maps only fencing and epoch errors to a task migration); rebuilding clients
/// every few seconds would only hide a missing ACL behind a loop.
fn is_refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::Authentication
    )
}

/// The group no longer knows this consumer as the member it was: a transaction's offsets
/// refused for its member id or generation (a static instance id taken over is fencing above).
/// Kafka's producer raises these as `CommitFailedException` and Kafka Streams makes them a task
/// migration. Aborting and going on would keep the tasks and their read positions, and the group
/// may have handed the partitions to a member that committed past them since (a chaos run with
/// two threads per instance caught a woken zombie, rejoined under a new member id, committing
/// from its old position: cause 7). Checked before librdkafka's own abortable flag, which these
/// carry.
fn is_stale_membership(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::UnknownMemberId | RDKafkaErrorCode::IllegalGeneration
    )
}

/// The step of a transaction a Kafka error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStep {
    /// Producing a record into the open transaction (or beginning it).
    Produce,
    /// Adding the consumed offsets (`send_offsets_to_transaction`), before any EndTxn.
    SendOffsets,
    /// `commit_transaction`: the EndTxn request, which the coordinator may have written
    /// (PrepareCommit) although the call failed.
    EndTxn,
}

/// What the stream thread does about a failed transactional step.
#[derive(Debug)]
pub enum Recovery {
    /// Nothing of the transaction can have committed: abort it, drop the stores' uncommitted
    /// writes and rewind the consumed partitions to the transaction's first records.
    AbortAndRewind,
    /// The outcome is unknown or the clients are unusable: never commit or rewind on this
    /// transaction; end the generation (the next producer's `init_transactions` completes or
    /// aborts it on the broker, and the tasks restore whatever committed).
    Restart(EngineError),
}

/// The one decision for every failed transactional step.
///
/// A timed-out or otherwise failed `commit_transaction` is ambiguous unless librdkafka says the
/// transaction must be aborted: the coordinator may have written PrepareCommit and will complete
/// the commit, so aborting locally and processing the records again would make them visible
/// twice, and dropping them as committed would lose them if it aborted.
pub fn recovery(err: KafkaError, step: TxnStep) -> Recovery {
    let class = classify(&err);
    let requires_abort = matches!(&err, KafkaError::Transaction(e) if e.txn_requires_abort());
    match (class, step) {
        (ErrorClass::Fenced, _) => Recovery::Restart(EngineError::TaskMigrated(
            anyhow::Error::new(err).context(format!("{step:?} in the transaction")),
        )),
        (ErrorClass::Refused, _) => {
            Recovery::Restart(EngineError::refused(err, &format!("{step:?} in the transaction")))
        }
        (ErrorClass::Abortable, TxnStep::EndTxn) if requires_abort => Recovery::AbortAndRewind,
        (ErrorClass::Abortable | ErrorClass::Retriable, TxnStep::Produce | TxnStep::SendOffsets) => {
            Recovery::AbortAndRewind
        }
        (_, TxnStep::EndTxn) => Recovery::Restart(EngineError::Transient(
            anyhow::Error::new(err).context("committing the transaction (outcome unknown)"),
        )),
        (ErrorClass::Fatal, _) => Recovery::Restart(EngineError::Transient(
            anyhow::Error::new(err).context(format!("{step:?} in the transaction")),
        )),
    }
}

/// True when `err` was caused by a Kafka error worth waiting out (the cluster unreachable or
/// still starting), as opposed to one that needs a change (configuration, authorization).
pub fn worth_waiting(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|cause| cause.downcast_ref::<KafkaError>())
        .any(|k| classify(k) == ErrorClass::Retriable)
}

/// True when `err`, or an error it wraps, says a filesystem is full: no retry can succeed until
/// an operator frees space.
pub fn storage_full(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
            // RocksDB reports its I/O errors as text only.
            || cause.to_string().contains("No space left on device")
    })
}

/// Why a stream thread's generation ended, by domain: who can fix it decides what the thread
/// does next. The fourth domain, data (a record that cannot be processed), never ends a
/// generation: it costs one dead letter ([`crate::processors::Rejection`]).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Not a failure: another member owns the tasks now (a fenced producer, a lost membership).
    /// The tasks close and the thread rejoins at once.
    #[error("tasks migrated: {0:#}")]
    TaskMigrated(anyhow::Error),
    /// External and transient: the cluster or a client failed in a way that passes (a broker
    /// away, a call timed out). The thread starts fresh clients after a growing backoff.
    #[error("stream thread failed: {0:#}")]
    Transient(anyhow::Error),
    /// User or configuration: only an operator can fix it (credentials, an ACL, client
    /// settings, a full volume). The instance stops, and `/health/live` fails with the fix.
    #[error("{0:#}")]
    Config(anyhow::Error),
    /// Internal: a task's local state cannot be read (RocksDB finds its database damaged, or a
    /// stored value does not decode). The task's directory is moved aside and restored from its
    /// changelog; a value that comes back from the changelog then costs each record meeting it a
    /// dead letter, and damage found again stops the instance (a failing disk).
    #[error("corrupt state in {}: {source:#}", dir.display())]
    Corrupt {
        /// The task's state directory.
        dir: std::path::PathBuf,
        /// What could not be read.
        source: anyhow::Error,
    },
    /// Internal: an invariant of tally broke (a bug). The generation restarts from what Kafka
    /// committed after a backoff; the log asks for a report.
    #[error("internal error (a bug in tally; please report it with this log): {0:#}")]
    Internal(anyhow::Error),
}

impl EngineError {
    /// A task migration for `why`.
    pub fn migrated(why: impl std::fmt::Display) -> Self {
        EngineError::TaskMigrated(anyhow::anyhow!("{why}"))
    }

    /// Maps a Kafka error that could not be handled in place, with context.
    pub fn from_kafka(err: KafkaError, during: &str) -> Self {
        if let KafkaError::ClientCreation(why) = &err {
            let why = why.clone();
            return EngineError::Config(anyhow::Error::new(err).context(format!(
                "{during}: the Kafka client settings are invalid ({why}); fix them in `kafka.properties` or \
                 the topology's `kafka` section, then start tally again"
            )));
        }
        match classify(&err) {
            ErrorClass::Fenced => EngineError::TaskMigrated(anyhow::Error::new(err).context(during.to_string())),
            ErrorClass::Refused => EngineError::refused(err, during),
            _ => EngineError::Transient(anyhow::Error::new(err).context(during.to_string())),
        }
    }

    /// Maps a failure that may wrap a Kafka error or a full filesystem, with context: the
    /// domain of the first cause that has one, else transient.
    pub fn from_any(err: anyhow::Error, during: &str) -> Self {
        if storage_full(&err) {
            return EngineError::Config(err.context(format!(
                "{during}: the state directory's filesystem is full: free space or give it a larger volume, \
                 then start tally again (committed work is safe: the stores catch up from their changelogs)"
            )));
        }
        let kafka = err.chain().find_map(|c| c.downcast_ref::<KafkaError>()).cloned();
        match kafka.map(|k| EngineError::from_kafka(k, during)) {
            Some(EngineError::TaskMigrated(_)) => EngineError::TaskMigrated(err.context(during.to_string())),
            Some(EngineError::Config(fix)) => EngineError::Config(fix),
            _ => EngineError::Transient(err.context(during.to_string())),
        }
    }

    fn refused(err: KafkaError, during: &str) -> Self {
        let what = match code(&err) {
            Some(RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Authentication) => {
                "rejected this instance's credentials"
            }
            _ => "refused this instance's principal",
        };
        let fix = code(&err).map_or(GENERIC_FIX, refusal_fix);
        EngineError::Config(anyhow::Error::new(err).context(format!(
            "{during}: the Kafka cluster {what}; {fix}, then start tally again"
        )))
    }
}

/// The fix for a refusal whose code says little.
const GENERIC_FIX: &str = "grant this principal the ACLs README.md lists under \"Secured clusters\" (the broker's \
     authorizer log names the operation it denied) or fix the credentials in `kafka.properties`";

/// What an operator does about refusal `code`: the ACL (README.md's \"Secured clusters\" table) or
/// the setting to change.
pub fn refusal_fix(code: RDKafkaErrorCode) -> &'static str {
    match code {
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            "grant this principal Write and Describe on the transactional ids prefixed \
             `<application_id>-` (README.md, \"Secured clusters\")"
        }
        RDKafkaErrorCode::GroupAuthorizationFailed => {
            "grant this principal Read and Describe on the groups prefixed `<application_id>` \
             (README.md, \"Secured clusters\")"
        }
        RDKafkaErrorCode::TopicAuthorizationFailed => {
            "grant this principal the topic ACLs README.md lists under \"Secured clusters\": Read and Describe on \
             the sources; Write, Describe and DescribeConfigs on the outputs, dead-letter, trace and alerts \
             topics (and Read on the trace topic with `reconcile`); Create, Read, Write, Describe and \
             DescribeConfigs on the ID-mapping topic; Create, Read, Write, Describe, DescribeConfigs and Delete \
             on the topics prefixed `<application_id>-`"
        }
        RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Authentication => {
            "fix `sasl.username`, `sasl.password` or `sasl.mechanism` in `kafka.properties` (or the \
             environment variables they come from), or create the user on the cluster"
        }
        _ => GENERIC_FIX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_filesystem_is_recognised_from_io_errors_and_from_rocksdb_text() {
        let io = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::StorageFull)).context("writing");
        assert!(storage_full(&io));
        let rocksdb = anyhow::anyhow!("IO error: No space left on device: While appending to file: 000004.log")
            .context("committing the store of payments-0");
        assert!(storage_full(&rocksdb));
        let other = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(!storage_full(&other));
    }

    #[test]
    fn codes_map_to_their_recovery() {
        let c = |code| classify(&KafkaError::MessageProduction(code));
        assert_eq!(c(RDKafkaErrorCode::QueueFull), ErrorClass::Retriable);
        assert_eq!(c(RDKafkaErrorCode::ProducerFenced), ErrorClass::Fenced);
        assert_eq!(c(RDKafkaErrorCode::InvalidProducerEpoch), ErrorClass::Fenced);
        assert_eq!(c(RDKafkaErrorCode::RebalanceInProgress), ErrorClass::Abortable);
        assert_eq!(c(RDKafkaErrorCode::TopicAuthorizationFailed), ErrorClass::Refused);
        assert_eq!(c(RDKafkaErrorCode::UnknownTopicOrPartition), ErrorClass::Fatal);
    }

    #[test]
    fn a_commit_of_unknown_outcome_is_never_aborted_and_rewound() {
        // rdkafka offers no constructor for its transaction errors; the code carries the class.
        let timed_out = KafkaError::MessageProduction(RDKafkaErrorCode::OperationTimedOut);
        assert!(matches!(
            recovery(timed_out.clone(), TxnStep::EndTxn),
            Recovery::Restart(EngineError::Transient(_))
        ));
        assert!(matches!(
            recovery(timed_out, TxnStep::SendOffsets),
            Recovery::AbortAndRewind
        ));
        let refused = KafkaError::MessageProduction(RDKafkaErrorCode::State);
        assert!(matches!(recovery(refused, TxnStep::Produce), Recovery::AbortAndRewind));
        let fenced = KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced);
        assert!(matches!(
            recovery(fenced, TxnStep::EndTxn),
            Recovery::Restart(EngineError::TaskMigrated(_))
        ));
        for stale in [
            RDKafkaErrorCode::UnknownMemberId,
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::FencedInstanceId,
        ] {
            assert!(
                matches!(
                    recovery(KafkaError::MessageProduction(stale), TxnStep::SendOffsets),
                    Recovery::Restart(EngineError::TaskMigrated(_))
                ),
                "{stale:?}: the group moved on, the tasks go (never abort and keep their positions)"
            );
        }
        for (denied, fix) in [
            (
                RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
                "on the transactional ids prefixed",
            ),
            (RDKafkaErrorCode::GroupAuthorizationFailed, "on the groups prefixed"),
            (RDKafkaErrorCode::TopicAuthorizationFailed, "topic ACLs"),
            (RDKafkaErrorCode::SaslAuthenticationFailed, "`sasl.password`"),
        ] {
            let Recovery::Restart(EngineError::Config(e)) =
                recovery(KafkaError::MessageProduction(denied), TxnStep::EndTxn)
            else {
                panic!("{denied:?}: a refusal stops the instance, no retry, no rejoin");
            };
            assert!(format!("{e:#}").contains(fix), "it says what to fix: {e:#}");
        }
    }

    #[test]
    fn fenced_errors_become_task_migrations() {
        let e = EngineError::from_kafka(
            KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
            "commit",
        );
        assert!(matches!(e, EngineError::TaskMigrated(_)));
    }

    #[test]
    fn each_failure_lands_in_the_domain_of_who_can_fix_it() {
        let settings = KafkaError::ClientCreation("Invalid value \"x\" for configuration property \"acks\"".into());
        let EngineError::Config(e) = EngineError::from_kafka(settings, "creating the consumer") else {
            panic!("invalid client settings need an operator");
        };
        assert!(format!("{e:#}").contains("kafka.properties"), "it names the fix: {e:#}");
        let full = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::StorageFull)).context("writing");
        let EngineError::Config(e) = EngineError::from_any(full, "committing the store") else {
            panic!("a full filesystem needs an operator");
        };
        assert!(format!("{e:#}").contains("free space"), "{e:#}");
        let denied = anyhow::Error::new(KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed))
            .context("reading the changelog");
        assert!(matches!(
            EngineError::from_any(denied, "restoring"),
            EngineError::Config(_)
        ));
        let fenced = anyhow::Error::new(KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced))
            .context("reading the changelog");
        assert!(matches!(
            EngineError::from_any(fenced, "restoring"),
            EngineError::TaskMigrated(_)
        ));
        let away = anyhow::Error::new(KafkaError::MetadataFetch(RDKafkaErrorCode::AllBrokersDown));
        assert!(matches!(
            EngineError::from_any(away, "restoring"),
            EngineError::Transient(_)
        ));
        assert!(matches!(
            EngineError::from_any(anyhow::anyhow!("connection reset"), "restoring"),
            EngineError::Transient(_)
        ));
    }

    #[test]
    fn an_admin_operation_error_is_classified_by_its_code() {
        let dropped = anyhow::Error::new(KafkaError::AdminOp(RDKafkaErrorCode::BrokerTransportFailure))
            .context("cannot read the configuration of the topics tally writes");
        assert!(worth_waiting(&dropped), "a dropped connection at start is waited out");
        assert_eq!(
            classify(&KafkaError::AdminOp(RDKafkaErrorCode::TopicAuthorizationFailed)),
            ErrorClass::Refused
        );
        assert_eq!(
            code(&KafkaError::AdminOp(RDKafkaErrorCode::RequestTimedOut)),
            Some(RDKafkaErrorCode::RequestTimedOut)
        );
    }

    #[test]
    fn an_unreachable_cluster_is_waited_for_and_a_refusal_is_not() {
        let down = anyhow::Error::new(KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut))
            .context("cannot read metadata of topic `in`");
        assert!(worth_waiting(&down));
        let refused = anyhow::Error::new(KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed))
            .context("cannot read metadata of topic `in`");
        assert!(!worth_waiting(&refused));
        assert!(!worth_waiting(&anyhow::anyhow!("not a number of bytes")));
    }
}

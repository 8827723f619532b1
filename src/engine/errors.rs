//! The one place Kafka errors are classified, as librdkafka defines them.

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
    /// The client is unusable: rebuild the stream thread's clients after a backoff.
    Fatal,
}

/// Classifies an error from a producer, consumer or transaction call.
pub fn classify(err: &KafkaError) -> ErrorClass {
    if let KafkaError::Transaction(e) = err {
        if e.is_fatal() {
            return if is_fencing(e.code()) {
                ErrorClass::Fenced
            } else {
                ErrorClass::Fatal
            };
        }
        if e.txn_requires_abort() {
            return ErrorClass::Abortable;
        }
        if e.is_retriable() {
            return ErrorClass::Retriable;
        }
    }
    match err.rdkafka_error_code() {
        Some(code) if is_fencing(code) => ErrorClass::Fenced,
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
            | RDKafkaErrorCode::IllegalGeneration
            | RDKafkaErrorCode::UnknownMemberId
            | RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidRecord,
        ) => ErrorClass::Abortable,
        _ => ErrorClass::Fatal,
    }
}

fn is_fencing(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::FencedInstanceId
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

/// Why a stream thread's generation ended.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The tasks moved to another instance (fenced producer, lost membership).
    #[error("tasks migrated: {0}")]
    TaskMigrated(String),
    /// A client or store failure that needs fresh clients; retried after a backoff.
    #[error("stream thread failed: {0:#}")]
    Fatal(anyhow::Error),
}

impl EngineError {
    /// Maps a Kafka error that could not be handled in place, with context.
    pub fn from_kafka(err: KafkaError, during: &str) -> Self {
        match classify(&err) {
            ErrorClass::Fenced => EngineError::TaskMigrated(format!("{during}: {err}")),
            _ => EngineError::Fatal(anyhow::Error::new(err).context(during.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_their_recovery() {
        let c = |code| classify(&KafkaError::MessageProduction(code));
        assert_eq!(c(RDKafkaErrorCode::QueueFull), ErrorClass::Retriable);
        assert_eq!(c(RDKafkaErrorCode::ProducerFenced), ErrorClass::Fenced);
        assert_eq!(c(RDKafkaErrorCode::InvalidProducerEpoch), ErrorClass::Fenced);
        assert_eq!(c(RDKafkaErrorCode::RebalanceInProgress), ErrorClass::Abortable);
        assert_eq!(c(RDKafkaErrorCode::TopicAuthorizationFailed), ErrorClass::Fatal);
    }

    #[test]
    fn fenced_errors_become_task_migrations() {
        let e = EngineError::from_kafka(
            KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
            "commit",
        );
        assert!(matches!(e, EngineError::TaskMigrated(_)));
    }
}

//! Consumer errors the stream thread goes on after, logged without flooding the log.

use rdkafka::error::KafkaError;
use std::time::{Duration, Instant};

/// Consumer errors the loop goes on after, logged once per kind and interval: with the cluster
/// away the consumer reports one every poll.
#[derive(Default)]
pub(super) struct RepeatedErrors {
    last: Option<(String, Instant)>,
    suppressed: u64,
}

impl RepeatedErrors {
    /// How long the same error stays quiet after it was logged.
    const QUIET: Duration = Duration::from_secs(10);

    /// Logs `e` unless the same error was logged less than [`Self::QUIET`] ago; true if it
    /// was logged.
    pub(super) fn seen(&mut self, e: &KafkaError) -> bool {
        let text = e.to_string();
        let repeated = self
            .last
            .as_ref()
            .is_some_and(|(last, at)| *last == text && at.elapsed() < Self::QUIET);
        if repeated {
            self.suppressed += 1;
            return false;
        }
        tracing::warn!(error = %text, repeated_since_last_logged = self.suppressed, "consumer error");
        self.last = Some((text, Instant::now()));
        self.suppressed = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn the_same_error_is_logged_once_per_interval_and_another_at_once() {
        let down = KafkaError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown);
        let other = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        let mut errors = RepeatedErrors::default();
        assert!(errors.seen(&down));
        assert!(!errors.seen(&down));
        assert!(!errors.seen(&down));
        assert_eq!(errors.suppressed, 2);
        assert!(errors.seen(&other));
        assert!(errors.seen(&down), "a different error in between is news");
    }
}

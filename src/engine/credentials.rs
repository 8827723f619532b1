//! Tells a cluster that rejects the client's credentials or certificate from one that cannot be
//! reached. librdkafka reports a failed SASL login, or a broker certificate it cannot verify,
//! only as an error event on the client's main queue (which an admin client never serves); the
//! request that needed the connection fails as a transport failure like any other, and tally
//! would wait for the cluster forever.

use super::{admin, clients};
use crate::topology::Topology;
use anyhow::Result;
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientConfig;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// librdkafka properties whose values are secrets (those it marks sensitive, less file paths).
pub const SECRET_PROPERTIES: &[&str] = &[
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
];

/// True when the value of librdkafka property `key` is a secret.
pub fn is_secret(key: &str) -> bool {
    SECRET_PROPERTIES.contains(&key)
}

/// How long one metadata request of the probe waits before the probe looks at the events.
const STEP: Duration = Duration::from_millis(500);

/// The cluster would not let the client in: no retry can succeed until an operator changes the
/// client's settings.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Rejected(String);

/// Why the cluster would not let the client in, with librdkafka's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rejection {
    /// The SASL login failed: wrong user name, password or mechanism.
    Credentials(String),
    /// The broker's certificate could not be verified against the configured CA.
    Certificate(String),
}

/// A client context that remembers the first rejection librdkafka reports.
#[derive(Default)]
struct Watch {
    rejected: Mutex<Option<Rejection>>,
}

impl Watch {
    fn rejected(&self) -> Option<Rejection> {
        self.rejected.lock().map(|r| r.clone()).unwrap_or(None)
    }
}

impl ClientContext for Watch {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // The probe's client gets every client's settings (consumer ones too); librdkafka's
        // warnings that some do not apply to it say nothing about the settings' users.
        if fac != "CONFWARN" {
            DefaultClientContext.log(level, fac, log_message);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(r) = rejection(&error, reason) {
            if let Ok(mut slot) = self.rejected.lock() {
                slot.get_or_insert(r);
            }
        }
        tracing::warn!(target: "librdkafka", "librdkafka: {error}: {reason}");
    }
}

impl ProducerContext for Watch {
    type DeliveryOpaque = ();
    // The probe produces nothing.
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// The rejection an error event reports, if it is one.
fn rejection(error: &KafkaError, reason: &str) -> Option<Rejection> {
    match error.rdkafka_error_code()? {
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
            Some(Rejection::Credentials(reason.to_string()))
        }
        // Other TLS failures (a connection reset during the handshake) can pass by themselves.
        RDKafkaErrorCode::SSL
            if reason.contains("certificate verify failed") || reason.contains("could not be verified") =>
        {
            Some(Rejection::Certificate(reason.to_string()))
        }
        _ => None,
    }
}

/// The sentence for a rejection; `settings` names where the client's settings come from
/// (`kafka.properties`, say).
fn explain(r: &Rejection, settings: &str) -> String {
    match r {
        Rejection::Credentials(reason) => format!(
            "the Kafka cluster rejected the credentials ({reason}); fix `sasl.username`, `sasl.password` or \
             `sasl.mechanism` in {settings} (or the environment variables they come from), or create the user \
             on the cluster"
        ),
        Rejection::Certificate(reason) => format!(
            "the Kafka broker's certificate could not be verified ({reason}); point `ssl.ca.location` in \
             {settings} at the CA that signed it"
        ),
    }
}

/// Connects with `config` and asks for the cluster's metadata until it answers or `timeout`
/// passes. Ok once it answered; a [`Rejected`] error naming what to fix in `settings` when the
/// cluster rejected the credentials or its certificate could not be verified; otherwise the
/// last request's error (the cluster is down or still starting: worth waiting for).
pub fn probe(config: &ClientConfig, settings: &str, timeout: Duration) -> Result<()> {
    let producer: BaseProducer<Watch> = config
        .create_with_context(Watch::default())
        .map_err(|e| anyhow::Error::new(e).context(format!("cannot create a Kafka client; check {settings}")))?;
    let deadline = Instant::now() + timeout;
    loop {
        // Every topic's metadata: asking for one could create it on a cluster that auto-creates.
        let answer = producer.client().fetch_metadata(None, STEP);
        // Error events wait on the main queue until served.
        producer.poll(Duration::ZERO);
        if let Some(r) = producer.context().rejected() {
            return Err(Rejected(explain(&r, settings)).into());
        }
        match answer {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(anyhow::Error::new(e).context("cannot reach the Kafka cluster: is the broker reachable?"))
            }
            Err(_) => {}
        }
    }
}

/// [`probe`] with a topology's bootstrap servers and `kafka.properties`, for the one-shot
/// commands (`inspect`, `redrive`, `reset`, `reconcile ack`) before their first request: without it a wrong
/// password reads as a cluster that never answers. `file` is the topology file, for the message.
pub fn probe_topology(t: &Topology, file: &Path) -> Result<()> {
    probe(
        &clients::base(t),
        &format!("`kafka.properties` of {}", file.display()),
        admin::METADATA_TIMEOUT,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_login_and_an_unverified_certificate_are_rejections_and_a_lost_connection_is_not() {
        let login = rejection(
            &KafkaError::Global(RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed during authentication due to invalid credentials",
        );
        let Some(login) = login else {
            panic!("a failed login is a rejection")
        };
        let text = explain(&login, "`kafka.properties`");
        assert!(
            text.contains("`sasl.password`") && text.contains("`kafka.properties`"),
            "{text}"
        );
        let cert = rejection(
            &KafkaError::Global(RDKafkaErrorCode::SSL),
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified",
        );
        assert!(matches!(cert, Some(Rejection::Certificate(_))));
        assert_eq!(
            rejection(
                &KafkaError::Global(RDKafkaErrorCode::SSL),
                "SSL handshake failed: Disconnected"
            ),
            None
        );
        assert_eq!(
            rejection(
                &KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
                "Connection refused"
            ),
            None
        );
    }
}

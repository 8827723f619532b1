//! The HTTP endpoints: Prometheus `/metrics`, `/health/live`, `/health/ready`, and the store
//! queries under `/queries` (queries.rs).

pub mod queries;

use crate::engine::health::Health;
use crate::engine::Shutdown;
use crate::metrics::Metrics;
use anyhow::{Context, Result};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus::{Encoder, TextEncoder};
use queries::QueryApi;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    queries: Arc<QueryApi>,
}

/// Listens on `addr`: done before the engine starts, so an address in use stops tally at once
/// instead of surfacing when it shuts down.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for /metrics, /health and /queries; choose another --http-address")
    })
}

/// Connections served at once; more wait in the kernel's backlog. A scraper and two probes need
/// a handful, and each connection holds a file descriptor that the Kafka clients and RocksDB
/// need too.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client has to send a request's headers before it is disconnected.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one connection may last, requests and idle time together.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Serves the endpoints on `listener` until `shutdown` is triggered.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    queries: Arc<QueryApi>,
    shutdown: Shutdown,
) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/queries", get(query_index))
        .route("/queries/{pipeline}/{store}/{key}", get(query_key))
        .with_state(AppState {
            metrics,
            health,
            queries,
        });
    let addr = listener.local_addr().context("reading the HTTP listener's address")?;
    tracing::info!(%addr, "serving /metrics, /health/live and /health/ready");
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let stopped = || async {
        while !shutdown.is_triggered() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.context("the connection limit closed")?,
            () = stopped() => return Ok(()),
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stopped() => return Ok(()),
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            // Errors (a client gone, a timeout) end only that connection.
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(permit);
        });
    }
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    let mut body = Vec::new();
    match TextEncoder::new().encode(&s.metrics.registry().gather(), &mut body) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn query_index(State(s): State<AppState>) -> impl IntoResponse {
    s.queries.index()
}

async fn query_key(
    State(s): State<AppState>,
    uri: Uri,
    Path((pipeline, store, key)): Path<(String, String, String)>,
) -> impl IntoResponse {
    s.queries.key(&uri, &pipeline, &store, &key).await
}

async fn live(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.failure() {
        None => (StatusCode::OK, "live\n".to_string()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not live: {why}\n")),
    }
}

async fn ready(State(s): State<AppState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: joining the group, restoring state or loading id mappings\n",
        )
    }
}

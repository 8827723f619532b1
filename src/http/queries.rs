//! `/queries`: read-only lookups of one key in the stores, answered by the instance serving the
//! key's partition or redirected (307) to it; off unless the topology enables `queries:`.

use crate::metrics::events::QueryAnswered;
use crate::metrics::Metrics;
use crate::queries::keys::lookup;
use crate::queries::routing::{plan, Otherwise, Situation};
use crate::queries::Shared;
use crate::recover::state::describe;
use crate::store::published::Found;
use crate::topology::partitioner::Partitioner;
use crate::topology::{Pipeline, QuerySettings, StoreKind, Topology};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Longest key accepted, in bytes after URL decoding.
pub const MAX_KEY_BYTES: usize = 4096;
/// Longest request target (path and query) accepted.
pub const MAX_URI_BYTES: usize = 16 * 1024;
/// Queries read at once; more are told to retry (each read is a blocking RocksDB lookup).
pub const MAX_CONCURRENT: usize = 8;
/// What `Retry-After` says when nobody can answer now.
const RETRY_AFTER_S: u64 = 2;

/// What the query endpoints need.
pub struct QueryApi {
    topology: Arc<Topology>,
    instance: String,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    running: Semaphore,
}

impl QueryApi {
    /// The endpoints of instance `instance` running `topology`.
    pub fn new(topology: Arc<Topology>, instance: &str, shared: Arc<Shared>, metrics: Arc<Metrics>) -> Self {
        Self {
            topology,
            instance: instance.to_string(),
            shared,
            metrics,
            running: Semaphore::new(MAX_CONCURRENT),
        }
    }

    fn settings(&self) -> Option<&QuerySettings> {
        self.topology.queries.as_ref()
    }

    fn answer(&self, outcome: &str, status: StatusCode, body: Value) -> Response {
        self.metrics.emit(QueryAnswered { outcome });
        let mut text = body.to_string();
        text.push('\n');
        (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
    }

    fn disabled(&self) -> Response {
        self.answer(
            "disabled",
            StatusCode::NOT_FOUND,
            json!({"error": "queries are off on this instance; enable them in the topology with \
                   `queries: { enabled: true, advertised_url: \"http://{instance}.<service>:<port>\" }` \
                   and restart"}),
        )
    }

    fn unavailable(&self, why: &str) -> Response {
        let mut r = self.answer(
            "unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": format!("no instance can answer now: {why}; retry in a few seconds")}),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
        r
    }

    /// `GET /queries`: the pipelines, their stores, and who serves each partition.
    pub fn index(&self) -> Response {
        let Some(settings) = self.settings() else {
            return self.disabled();
        };
        let seen = self.shared.group();
        let pipelines: Vec<Value> = self
            .topology
            .pipelines
            .iter()
            .map(|p| {
                let topic = p.process_topic();
                let here = self.shared.stores.partitions(&p.name);
                let owners = seen.as_ref().map(|s| s.owners_of(topic)).unwrap_or_default();
                let count = seen
                    .as_ref()
                    .and_then(|s| s.partitions.get(topic).copied())
                    .unwrap_or(0);
                let partitions: Vec<Value> = (0..count)
                    .map(|n| {
                        let owner = owners.get(&n);
                        json!({
                            "partition": n,
                            "owner": owner,
                            "url": owner.and_then(|o| settings.url_of(o)),
                            "served_here": here.contains(&n),
                        })
                    })
                    .collect();
                json!({
                    "name": p.name,
                    "topic": topic,
                    "stores": p.store_names(),
                    "key_decides_partition": p.repartition.is_some() || p.co_partitioned.is_some(),
                    "served_here": here,
                    "partitions": partitions,
                })
            })
            .collect();
        self.answer(
            "index",
            StatusCode::OK,
            json!({
                "instance": self.instance,
                "url": settings.url_of(&self.instance),
                "group_view_age_ms": seen.map(|s| s.at.elapsed().as_millis() as u64),
                "pipelines": pipelines,
            }),
        )
    }

    /// `GET /queries/{pipeline}/{store}/{key}`: the committed value of one key.
    pub async fn key(&self, uri: &Uri, pipeline: &str, store: &str, key: &str) -> Response {
        let Some(settings) = self.settings() else {
            return self.disabled();
        };
        let target_len = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
        if target_len > MAX_URI_BYTES || key.len() > MAX_KEY_BYTES {
            return self.answer(
                "rejected",
                StatusCode::URI_TOO_LONG,
                json!({"error": format!("keys are at most {MAX_KEY_BYTES} bytes and requests {MAX_URI_BYTES}")}),
            );
        }
        let Ok(_permit) = self.running.try_acquire() else {
            let mut r = self.answer(
                "rejected",
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": format!("{MAX_CONCURRENT} queries are already running here; retry shortly")}),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            return r;
        };
        let t = &self.topology;
        let Some(p) = t.pipelines.iter().find(|p| p.name == pipeline) else {
            return self.answer(
                "unknown",
                StatusCode::NOT_FOUND,
                json!({"error": format!("no pipeline `{pipeline}`"), "pipelines": t.pipeline_names()}),
            );
        };
        let Some(kind) = p
            .store_kinds()
            .into_iter()
            .find(|k| store == k.as_str() || store == p.store_name(*k))
        else {
            return self.answer(
                "unknown",
                StatusCode::NOT_FOUND,
                json!({"error": format!("pipeline `{pipeline}` has no store `{store}`"), "stores": p.store_names()}),
            );
        };
        let Some(redirect) = Redirected::parse(uri.query()) else {
            return self.answer(
                "rejected",
                StatusCode::BAD_REQUEST,
                json!({"error": "the query string is not tally's (`searched=<partitions>&from=<instance>`)"}),
            );
        };
        let seen = self.shared.group();
        let local = self.shared.stores.partitions(&p.name);
        let count = seen.as_ref().and_then(|s| s.partitions.get(p.process_topic()).copied());
        let partitioner = Partitioner::of(&t.kafka.properties);
        let found = lookup(p, kind, key, partitioner, count.unwrap_or(0));
        let (candidates, owners) = match (&seen, count) {
            (Some(s), Some(n)) => (
                found.partitions.clone().unwrap_or_else(|| (0..n).collect()),
                Some(s.owners_of(p.process_topic())),
            ),
            // Without a view of the group only the partitions served here can be searched.
            _ => (local.clone(), None),
        };
        let route = plan(&Situation {
            candidates: &candidates,
            local: &local,
            owners: owners.as_ref(),
            me: &self.instance,
            searched: &redirect.searched,
            redirected: redirect.from.is_some(),
        });
        let ctx = Context { p, kind, key };
        match self.read(&ctx, &route.read_here, &found.stored).await {
            Err(Failed::Closed(partition)) => {
                return self.unavailable(&format!("partition {partition} was closed while being read"))
            }
            Err(Failed::Store(e)) => {
                return self.answer(
                    "error",
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"error": format!("{e}; see this instance's log")}),
                )
            }
            Ok(Some((partition, f))) => return self.found(&ctx, partition, &f),
            Ok(None) => {}
        }
        if seen.is_none() || count.is_none() {
            return self.unavailable("this instance has no recent view of the consumer group to find the key's owner");
        }
        match route.otherwise {
            Otherwise::NotFound => self.answer(
                "not_found",
                StatusCode::NOT_FOUND,
                json!({
                    "found": false, "pipeline": p.name, "store": p.store_name(kind), "key": key,
                    "partitions": candidates, "instance": self.instance,
                }),
            ),
            Otherwise::Unavailable(why) => self.unavailable(&why),
            Otherwise::Redirect {
                instance,
                partition,
                searched,
            } => {
                let Some(base) = settings.url_of(&instance) else {
                    return self.answer(
                        "error",
                        StatusCode::BAD_GATEWAY,
                        json!({"error": format!("partition {partition} is owned by instance `{instance}`, whose id makes no URL")}),
                    );
                };
                let mut location = format!("{base}{}?from={}", uri.path(), self.instance);
                if candidates.len() > 1 {
                    let list: Vec<String> = searched.iter().map(i32::to_string).collect();
                    let _ = write!(location, "&searched={}", list.join(","));
                }
                let Ok(value) = HeaderValue::from_str(&location) else {
                    return self.answer(
                        "error",
                        StatusCode::BAD_GATEWAY,
                        json!({"error": format!("cannot redirect to `{location}`")}),
                    );
                };
                let mut r = self.answer(
                    "redirected",
                    StatusCode::TEMPORARY_REDIRECT,
                    json!({"redirect": location, "instance": instance, "partition": partition}),
                );
                r.headers_mut().insert(header::LOCATION, value);
                r
            }
        }
    }

    /// Reads the candidate partitions served here, off the async workers; the first found.
    async fn read(
        &self,
        ctx: &Context<'_>,
        partitions: &[i32],
        stored: &[Vec<u8>],
    ) -> Result<Option<(i32, Found)>, Failed> {
        let (stores, pipeline, store) = (
            self.shared.stores.clone(),
            ctx.p.name.clone(),
            ctx.p.store_name(ctx.kind),
        );
        let (partitions, stored) = (partitions.to_vec(), stored.to_vec());
        let expired = expiry(ctx.p, ctx.kind);
        let read = tokio::task::spawn_blocking(move || {
            for partition in partitions {
                match stores.read(&pipeline, partition, &store, &stored) {
                    None => return Err(Failed::Closed(partition)),
                    Some(Err(e)) => return Err(Failed::Store(e)),
                    Some(Ok(Some(f))) if !expired(&f.value) => return Ok(Some((partition, f))),
                    Some(Ok(_)) => {}
                }
            }
            Ok(None)
        });
        read.await
            .unwrap_or_else(|e| Err(Failed::Store(format!("the read failed: {e}"))))
    }

    fn found(&self, ctx: &Context<'_>, partition: i32, f: &Found) -> Response {
        let hex: String = f.value.iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
        self.answer(
            "found",
            StatusCode::OK,
            json!({
                "found": true,
                "pipeline": ctx.p.name,
                "store": ctx.p.store_name(ctx.kind),
                "key": ctx.key,
                "partition": partition,
                "instance": self.instance,
                "value": describe(ctx.kind, Some(&f.value)),
                "raw_value_hex": hex,
            }),
        )
    }
}

/// The pipeline, store and key of one query.
struct Context<'a> {
    p: &'a Pipeline,
    kind: StoreKind,
    key: &'a str,
}

/// Why a read gave no answer.
enum Failed {
    /// The task stopped being served between the plan and the read.
    Closed(i32),
    /// RocksDB failed.
    Store(String),
}

/// True for a dedup value past the pipeline's longest retention: absent, as the strategy
/// treats it, even before expiry deletes it.
fn expiry(p: &Pipeline, kind: StoreKind) -> impl Fn(&[u8]) -> bool + Send + 'static {
    let retention = (kind == StoreKind::Dedup).then(|| p.max_retention()).flatten();
    move |value| {
        let Some(retention) = retention else {
            return false;
        };
        let Ok(entry) = crate::store::codec::decode::<crate::processors::dedup::DedupEntry>(value) else {
            return false;
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        let first = Duration::from_millis(entry.first_seen_ms.max(0) as u64);
        now.saturating_sub(first) >= retention
    }
}

/// The query string of a redirected query: who sent it and what was searched already.
#[derive(Debug, Default, PartialEq, Eq)]
struct Redirected {
    from: Option<String>,
    searched: BTreeSet<i32>,
}

impl Redirected {
    /// `None` when the query string is not one tally writes.
    fn parse(query: Option<&str>) -> Option<Self> {
        let mut r = Self::default();
        for pair in query.unwrap_or_default().split('&').filter(|s| !s.is_empty()) {
            match pair.split_once('=')? {
                ("from", instance) if !instance.is_empty() => r.from = Some(instance.to_string()),
                ("searched", "") => {}
                ("searched", list) => {
                    for n in list.split(',') {
                        r.searched.insert(n.parse().ok().filter(|n: &i32| *n >= 0)?);
                    }
                }
                _ => return None,
            }
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tallys_own_query_strings_are_taken() {
        assert_eq!(Redirected::parse(None), Some(Redirected::default()));
        let r = Redirected::parse(Some("from=a&searched=0,3")).expect("parses");
        assert_eq!(r.from.as_deref(), Some("a"));
        assert_eq!(r.searched, BTreeSet::from([0, 3]));
        assert_eq!(Redirected::parse(Some("searched=x")), None);
        assert_eq!(Redirected::parse(Some("searched=-1")), None);
        assert_eq!(Redirected::parse(Some("other=1")), None);
        assert_eq!(Redirected::parse(Some("from")), None);
    }
}

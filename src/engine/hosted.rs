//! Tasks the engine runs but does not define: the live reconciler's, which lives in
//! `reconcile::live` and depends on the engine, never the other way round. The caller of
//! [`super::run`] hands the engine a [`HostedTasks`] that opens them.

use super::errors::EngineError;
use super::task::Task;
use crate::metrics::Metrics;
use crate::store::TaskStore;
use crate::topology::Topology;
use std::sync::Arc;

/// What a reconciler task of trace partition `partition` is opened with.
pub struct ReconcilerParts {
    /// `reconcile-<partition>`, the task's name and metric label.
    pub name: String,
    /// The trace topic.
    pub topic: String,
    /// The trace partition.
    pub partition: i32,
    /// Its restored store.
    pub store: TaskStore,
    /// The changelog topic of each of its stores, in store-index order.
    pub changelogs: Vec<String>,
    /// The topology the engine runs.
    pub topology: Arc<Topology>,
    /// The instance's metrics.
    pub metrics: Arc<Metrics>,
}

/// Opens the tasks the engine hosts for other modules.
pub trait HostedTasks: Send + Sync {
    /// The live reconciler's task of one trace partition.
    fn reconciler(&self, parts: ReconcilerParts) -> Result<Box<dyn Task>, EngineError>;
}

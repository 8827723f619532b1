//! Where a stateful task keeps its stores: directory, store names and changelog topics.

use crate::topology::{Stage, Topology};
use std::path::PathBuf;

/// The on-disk and changelog layout of one stateful task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLayout {
    /// `<pipeline>-<partition>`.
    pub name: String,
    /// `<state.dir>/<application_id>/<name>`.
    pub dir: PathBuf,
    /// Store names, in store-index order.
    pub stores: Vec<String>,
    /// `changelogs[i]` is the changelog topic of store `i`.
    pub changelogs: Vec<String>,
}

impl TaskLayout {
    /// The layout of the task fed by `topic`/`partition`, if that stage keeps state.
    pub fn of(t: &Topology, topic: &str, partition: i32) -> Option<Self> {
        let name = t.task_name(topic, partition)?;
        let stores = if t.reconciled_topic() == Some(topic) {
            t.reconciler_stores()
        } else {
            match t.stage_for_topic(topic)? {
                (pipeline, Stage::Process) => pipeline.store_names(),
                (_, Stage::Repartition) => return None,
            }
        };
        Some(Self {
            dir: t.state_dir.join(&t.application_id).join(&name),
            changelogs: stores.iter().map(|s| t.changelog_topic(s)).collect(),
            stores,
            name,
        })
    }
}

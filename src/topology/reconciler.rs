//! The live reconciler as an application of its own (`tally reconcile live`): the topology it
//! runs is derived from tally's, so it has its own consumer group, transactional ids, stores
//! and changelogs, and keeps reporting while tally's instances are stalled, crashed or gone.

use super::{Pipeline, Topology};
use std::sync::Arc;

/// Which process runs the live reconciler's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReconcileRun {
    /// On the stream threads of `tally run`, next to the pipelines (it stalls with them).
    #[default]
    InProcess,
    /// As its own deployment, `tally reconcile live`; `tally run` leaves it out.
    Separately,
}

/// tally's inputs as the separately run reconciler watches them: records appended but not yet
/// consumed by tally's group for longer than the threshold are reported, one alert per record.
#[derive(Debug, Clone)]
pub struct Watch {
    /// tally's consumer group, whose committed offsets say what it has consumed.
    pub group: String,
    /// The topics tally's stream threads read: sources and repartition topics.
    pub topics: Vec<WatchedTopic>,
    /// True when tally starts a partition without a committed offset at its beginning
    /// (`auto.offset.reset` earliest, the default): such records are then tally's to process.
    pub from_earliest: bool,
}

/// One topic tally consumes.
#[derive(Debug, Clone)]
pub struct WatchedTopic {
    /// The topic.
    pub topic: String,
    /// The pipeline reading it (for the key and correlation id of an alert).
    pub pipeline: Arc<Pipeline>,
    /// True for a repartition topic: its records carry their source coordinates in headers.
    pub repartitioned: bool,
}

/// Suffix of the separately run reconciler's application id (its group, topics and ids).
pub const APPLICATION_SUFFIX: &str = "-reconcile";

impl Topology {
    /// The topology `tally reconcile live` runs: application `<application_id>-reconcile`, no
    /// pipelines, the reconciler reading the trace topic and watching tally's inputs. `Err`
    /// says why there is none (no `reconcile:` section, or it runs in process).
    pub fn reconciler_view(&self) -> Result<Topology, String> {
        let Some(settings) = &self.reconcile else {
            return Err("the topology has no `reconcile:` section; add one (README, \"Live reconciler\")".into());
        };
        if settings.run != ReconcileRun::Separately {
            return Err(
                "`reconcile.run` is `in_process`: `tally run` already runs the reconciler; set \
                        `reconcile.run: separately` to deploy it on its own"
                    .into(),
            );
        }
        let mut topics = Vec::new();
        for p in &self.pipelines {
            let pipeline = Arc::new(p.clone());
            topics.push(WatchedTopic {
                topic: p.input_topic.clone(),
                pipeline: pipeline.clone(),
                repartitioned: false,
            });
            if let Some(r) = &p.repartition {
                topics.push(WatchedTopic {
                    topic: r.topic.clone(),
                    pipeline,
                    repartitioned: true,
                });
            }
        }
        let from_earliest = self
            .kafka
            .properties
            .get("auto.offset.reset")
            .is_none_or(|v| matches!(v.as_str(), "earliest" | "smallest" | "beginning"));
        let mut view = self.clone();
        view.application_id = format!("{}{APPLICATION_SUFFIX}", self.application_id);
        view.sources.clear();
        view.pipelines.clear();
        view.id_mapping = None;
        // It has no pipeline stores to query.
        view.queries = None;
        // Its instances are interchangeable (a Deployment's pods get new names): a static member
        // that is gone would hold its partitions until the session times out.
        view.processing.static_membership = false;
        let mut settings = settings.clone();
        settings.run = ReconcileRun::InProcess;
        settings.watch = Some(Watch {
            group: self.application_id.clone(),
            topics,
            from_earliest,
        });
        view.reconcile = Some(settings);
        Ok(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(run: &str) -> Topology {
        let yaml = format!(
            r#"
application_id: pay
kafka: {{ bootstrap_servers: "127.0.0.1:9092" }}
processing: {{ static_membership: true }}
sources: {{ events: {{ topic: payments.events }} }}
pipelines:
  - name: payments
    from: events
    key: "{{payment_id}}:{{status}}"
    repartition: {{ key: "{{payment_id}}" }}
    routes: [{{ strategy: ignore, retention: 1h }}]
    to: {{ topic: payments.out }}
dead_letter: {{ topic: dlq }}
trace: {{ topic: trace }}
reconcile: {{ alerts_topic: alerts, run: {run} }}
"#
        );
        crate::config::load_str("t.yaml", &yaml, |_| None).expect("valid topology")
    }

    #[test]
    fn the_separate_reconciler_watches_sources_and_repartition_topics_under_its_own_id() {
        let t = topology("separately");
        assert_eq!(t.reconciled_topic(), None, "tally run leaves the reconciler out");
        assert!(t.changelog_topics().iter().all(|c| !c.contains("reconcile")));
        let view = t.reconciler_view().expect("a view");
        assert_eq!(view.application_id, "pay-reconcile");
        assert!(view.pipelines.is_empty());
        assert_eq!(view.reconciled_topic(), Some("trace"));
        assert_eq!(view.consumed_topics(), vec!["trace"]);
        assert!(t.processing.static_membership);
        assert!(
            !view.processing.static_membership,
            "reconciler pods are interchangeable"
        );
        let watch = view.reconcile.as_ref().and_then(|r| r.watch.clone()).expect("watch");
        assert_eq!(watch.group, "pay");
        assert!(watch.from_earliest);
        let topics: Vec<(&str, bool)> = watch
            .topics
            .iter()
            .map(|w| (w.topic.as_str(), w.repartitioned))
            .collect();
        assert_eq!(
            topics,
            vec![("payments.events", false), ("pay-payments-repartition", true)]
        );
        assert_eq!(
            view.changelog_topics(),
            vec![
                "pay-reconcile-reconcile-open-changelog".to_string(),
                "pay-reconcile-reconcile-watch-changelog".to_string()
            ]
        );
    }

    #[test]
    fn an_in_process_reconciler_has_no_separate_view() {
        let t = topology("in_process");
        assert_eq!(t.reconciled_topic(), Some("trace"));
        let why = t.reconciler_view().expect_err("no view");
        assert!(why.contains("reconcile.run: separately"), "{why}");
    }
}

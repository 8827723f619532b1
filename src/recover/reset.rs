//! An application reset, as Kafka's `kafka-streams-application-reset` does it: the next start
//! processes the sources again from their beginning with empty state. Internal topics
//! (changelogs, repartition topics) and the consumer group's offsets are deleted, and this
//! host's state directory; sources, outputs, dead letters, traces, alerts and the ID mappings
//! (business data shared with other systems) are left alone. Refused while the group has
//! members: a running instance would write into what is being deleted.

use crate::engine::clients;
use crate::topology::Topology;
use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::path::PathBuf;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// What a reset deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The consumer group whose offsets go.
    pub group: String,
    /// Internal topics that exist and go.
    pub topics: Vec<String>,
    /// This host's state directory of the application, when it exists.
    pub state_dir: Option<PathBuf>,
}

impl Plan {
    /// What the plan deletes, one line each.
    pub fn render(&self) -> String {
        let mut out = format!("consumer group `{}`: its committed offsets\n", self.group);
        for t in &self.topics {
            out.push_str(&format!("internal topic `{t}`\n"));
        }
        if let Some(d) = &self.state_dir {
            out.push_str(&format!("state directory `{}` (this host only)\n", d.display()));
        }
        out
    }
}

/// Works out the plan, refusing while the group has members.
pub fn plan(t: &Topology) -> Result<Plan> {
    let consumer = refuse_live_members(t)?;
    let metadata = consumer
        .fetch_metadata(None, TIMEOUT)
        .context("cannot list the cluster's topics")?;
    let existing: Vec<&str> = metadata.topics().iter().map(|m| m.name()).collect();
    let mut internal = t.changelog_topics();
    internal.push(t.routing_topic());
    internal.extend(
        t.pipelines
            .iter()
            .filter_map(|p| p.repartition.as_ref().map(|r| r.topic.clone())),
    );
    let topics = internal
        .into_iter()
        .filter(|n| existing.contains(&n.as_str()))
        .collect();
    let dir = t.state_dir.join(&t.application_id);
    Ok(Plan {
        group: t.application_id.clone(),
        topics,
        state_dir: dir.exists().then_some(dir),
    })
}

/// Refuses while the application's consumer group has live members, naming them; returns the
/// client it asked with, for more questions.
pub fn refuse_live_members(t: &Topology) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = clients::base(t).create().context("cannot create a Kafka client")?;
    let groups = consumer
        .fetch_group_list(Some(&t.application_id), TIMEOUT)
        .context("cannot describe the consumer group")?;
    let members: Vec<String> = groups
        .groups()
        .iter()
        .flat_map(|g| g.members())
        .map(|m| format!("{} ({})", m.client_id(), m.client_host()))
        .collect();
    if !members.is_empty() {
        bail!(
            "the group `{}` has {} live member(s): {}; stop every instance first",
            t.application_id,
            members.len(),
            members.join(", ")
        );
    }
    Ok(consumer)
}

/// Carries the plan out.
pub fn execute(t: &Topology, plan: &Plan) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = clients::base(t)
        .create()
        .context("cannot create the Kafka admin client")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime for admin requests")?;
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let groups = rt
        .block_on(admin.delete_groups(&[plan.group.as_str()], &options))
        .context("cannot delete the consumer group")?;
    for r in groups {
        match r {
            Ok(_) => {}
            // Never committed: nothing to delete.
            Err((_, rdkafka::types::RDKafkaErrorCode::GroupIdNotFound)) => {}
            Err((g, code)) => bail!("cannot delete consumer group `{g}`: {code}"),
        }
    }
    if !plan.topics.is_empty() {
        let names: Vec<&str> = plan.topics.iter().map(String::as_str).collect();
        for r in rt
            .block_on(admin.delete_topics(&names, &options))
            .context("cannot delete the internal topics")?
        {
            if let Err((topic, code)) = r {
                bail!("cannot delete topic `{topic}`: {code}");
            }
        }
    }
    if let Some(dir) = &plan.state_dir {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove `{}`", dir.display()))?;
    }
    Ok(())
}

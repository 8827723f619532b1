//! A topology drawn as a graph: topics, processing steps, stores and their changelogs, in
//! Mermaid (renders in GitHub and most Markdown viewers) or Graphviz DOT.

use super::{Strategy, Topology};
use std::fmt::Write as _;

/// What a node stands for, which decides its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Topic,
    Step,
    Store,
}

/// An edge's meaning: the record flow, or a side channel (changelog, dead letters, trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Flow,
    Side,
}

/// The graph both formats are written from.
#[derive(Default)]
struct Graph {
    nodes: Vec<(Kind, String)>,
    edges: Vec<(usize, usize, Line, Option<&'static str>)>,
}

impl Graph {
    /// The node with this kind and label, added once.
    fn node(&mut self, kind: Kind, label: String) -> usize {
        if let Some(i) = self.nodes.iter().position(|(k, l)| *k == kind && *l == label) {
            return i;
        }
        self.nodes.push((kind, label));
        self.nodes.len() - 1
    }

    fn edge(&mut self, from: usize, to: usize, line: Line, label: Option<&'static str>) {
        self.edges.push((from, to, line, label));
    }
}

fn strategy(s: &Strategy) -> String {
    match s {
        Strategy::Ignore { .. } => "ignore duplicates".to_string(),
        Strategy::Overwrite { version, .. } => format!("overwrite only with a higher {version}"),
        Strategy::Merge { into, .. } => format!("merge increments into {into}"),
        Strategy::RecordMapping => "record ID mappings".to_string(),
    }
}

fn graph(t: &Topology) -> Graph {
    let mut g = Graph::default();
    let dead_letters = g.node(Kind::Topic, t.dead_letter_topic.clone());
    let trace = t.trace.as_ref().map(|tr| g.node(Kind::Topic, tr.topic.clone()));
    let mappings = t.id_mapping.as_ref().map(|m| {
        let topic = g.node(Kind::Topic, m.topic.clone());
        let store = g.node(Kind::Store, "global ID mappings".to_string());
        g.edge(topic, store, Line::Side, Some("read in full"));
        store
    });
    for p in &t.pipelines {
        let source = g.node(Kind::Topic, p.input_topic.clone());
        let mut upstream = source;
        if let Some(r) = &p.repartition {
            let step = g.node(Kind::Step, format!("{}: repartition by {}", p.name, r.key));
            let topic = g.node(Kind::Topic, r.topic.clone());
            g.edge(upstream, step, Line::Flow, None);
            g.edge(step, topic, Line::Flow, None);
            g.edge(step, dead_letters, Line::Side, Some("dead letters"));
            upstream = topic;
        }
        let routes: Vec<String> = p.routes.iter().map(|r| strategy(&r.strategy)).collect();
        let step = g.node(Kind::Step, format!("{}: key {}; {}", p.name, p.key, routes.join(", ")));
        let co_partitioned = p.co_partitioned.as_ref().map(|_| "co-partitioned, no hop");
        g.edge(upstream, step, Line::Flow, co_partitioned);
        for name in p.store_names() {
            let store = g.node(Kind::Store, name.clone());
            let changelog = g.node(Kind::Topic, t.changelog_topic(&name));
            g.edge(step, store, Line::Side, None);
            g.edge(store, changelog, Line::Side, Some("changelog"));
        }
        if let (Some(store), false) = (mappings, p.map_ids.is_empty()) {
            g.edge(store, step, Line::Side, Some("ids"));
        }
        let sink = g.node(Kind::Topic, p.output.topic.clone());
        g.edge(step, sink, Line::Flow, None);
        g.edge(step, dead_letters, Line::Side, Some("dead letters"));
        if let Some(trace) = trace {
            g.edge(step, trace, Line::Side, Some("trace"));
        }
    }
    if let (Some(r), Some(trace)) = (&t.reconcile, trace) {
        let step = g.node(Kind::Step, "live reconciler".to_string());
        let store = g.node(Kind::Store, Topology::RECONCILE_STORE.to_string());
        let changelog = g.node(Kind::Topic, t.changelog_topic(Topology::RECONCILE_STORE));
        let alerts = g.node(Kind::Topic, r.alerts_topic.clone());
        g.edge(trace, step, Line::Flow, None);
        g.edge(step, store, Line::Side, None);
        g.edge(store, changelog, Line::Side, Some("changelog"));
        g.edge(step, alerts, Line::Flow, Some("alerts"));
    }
    g
}

/// Mermaid flowchart text; quotes in labels are written as `#quot;`.
pub fn mermaid(t: &Topology) -> String {
    let g = graph(t);
    let mut s = String::from("flowchart LR\n");
    for (i, (kind, label)) in g.nodes.iter().enumerate() {
        let label = label.replace('"', "#quot;");
        // Writing to a String cannot fail.
        let _ = match kind {
            Kind::Topic => writeln!(s, "  n{i}[/\"{label}\"/]"),
            Kind::Step => writeln!(s, "  n{i}[\"{label}\"]"),
            Kind::Store => writeln!(s, "  n{i}[(\"{label}\")]"),
        };
    }
    for (from, to, line, label) in &g.edges {
        let arrow = match line {
            Line::Flow => "-->",
            Line::Side => "-.->",
        };
        let _ = match label {
            Some(l) => writeln!(s, "  n{from} {arrow}|{l}| n{to}"),
            None => writeln!(s, "  n{from} {arrow} n{to}"),
        };
    }
    s
}

/// Graphviz DOT text (`dot -Tsvg`).
pub fn dot(t: &Topology) -> String {
    let g = graph(t);
    let quote = |l: &str| l.replace('\\', "\\\\").replace('"', "\\\"");
    let mut s = format!("digraph \"{}\" {{\n  rankdir=LR;\n", quote(&t.application_id));
    for (i, (kind, label)) in g.nodes.iter().enumerate() {
        let shape = match kind {
            Kind::Topic => "parallelogram",
            Kind::Step => "box",
            Kind::Store => "cylinder",
        };
        let _ = writeln!(s, "  n{i} [shape={shape}, label=\"{}\"];", quote(label));
    }
    for (from, to, line, label) in &g.edges {
        let style = match line {
            Line::Flow => "solid",
            Line::Side => "dashed",
        };
        let _ = match label {
            Some(l) => writeln!(s, "  n{from} -> n{to} [style={style}, label=\"{l}\"];"),
            None => writeln!(s, "  n{from} -> n{to} [style={style}];"),
        };
    }
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
application_id: shop
kafka: { bootstrap_servers: "localhost:9092" }
state: { dir: /tmp/x }
sources: { payments: { topic: payments } }
pipelines:
  - name: payments
    from: payments
    repartition: { key: "{payment_id}" }
    key: "{payment_id}:\"{status}"
    to: { topic: payments.deduped }
dead_letter: { topic: payments.dlq }
trace: { topic: trace }
reconcile: { alerts_topic: alerts }
"#;

    fn topology() -> Topology {
        crate::config::load_str("t.yaml", YAML, |_| None).expect("valid")
    }

    /// The label of a Mermaid node line `nI[...]`, by its label text.
    fn id_of(text: &str, label: &str) -> String {
        text.lines()
            .find(|l| l.contains(&format!("\"{label}\"")))
            .and_then(|l| l.trim().split('[').next())
            .unwrap_or_else(|| panic!("no node {label} in\n{text}"))
            .to_string()
    }

    #[test]
    fn mermaid_draws_the_flow_from_source_through_repartition_to_sink_with_stores_and_side_topics() {
        let text = mermaid(&topology());
        assert!(text.starts_with("flowchart LR\n"));
        let source = id_of(&text, "payments");
        let repartition = id_of(&text, "shop-payments-repartition");
        let dedup = id_of(&text, "payments-dedup");
        let changelog = id_of(&text, "shop-payments-dedup-changelog");
        let sink = id_of(&text, "payments.deduped");
        let dlq = id_of(&text, "payments.dlq");
        let step = id_of(&text, "payments: key {payment_id}:#quot;{status}; ignore duplicates");
        for edge in [
            format!("{repartition} --> {step}"),
            format!("{step} --> {sink}"),
            format!("{step} -.-> {dedup}"),
            format!("{dedup} -.->|changelog| {changelog}"),
            format!("{step} -.->|dead letters| {dlq}"),
        ] {
            assert!(text.contains(&edge), "missing `{edge}` in\n{text}");
        }
        assert!(text.lines().any(|l| l.starts_with(&format!("  {source} --> "))));
        assert!(text.contains("\"live reconciler\""));
    }

    #[test]
    fn dot_escapes_quotes_and_draws_side_channels_dashed() {
        let text = dot(&topology());
        assert!(text.starts_with("digraph \"shop\" {"));
        assert!(text.contains(":\\\"{status}"), "{text}");
        assert!(text.contains("[style=dashed, label=\"changelog\"]"));
        assert!(text.trim_end().ends_with('}'));
    }
}

//! The chaos verifier. It reads the topics and nothing else (no tally code, no logs, no metrics):
//! it recomputes from the input topics what each pipeline must have produced, by its own reading
//! of the rules, and compares every output, dead letter and trace record with that.

use crate::common::committed_reader;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// The pipelines of the chaos topology, in the order of [`Topics`]' arrays.
pub const PIPELINES: [&str; 3] = ["payments", "entities", "carts"];
const PAYMENTS: usize = 0;
const ENTITIES: usize = 1;
const CARTS: usize = 2;

/// The topics the verifier reads.
pub struct Topics {
    /// Input topic per pipeline.
    pub inputs: [String; 3],
    /// Output topic per pipeline.
    pub outputs: [String; 3],
    /// The one dead-letter topic.
    pub dlq: String,
    /// The trace topic (level `all`).
    pub trace: String,
}

/// A record's place: pipeline (input topic index), partition, offset.
type Place = (u8, i32, i64);

/// What the verifier found: the counts for the verdict line and every anomaly with examples.
#[derive(Default)]
pub struct Report {
    counts: [PipelineCounts; 3],
    anomalies: BTreeMap<&'static str, u64>,
    examples: Vec<String>,
    traced_events: u64,
}

#[derive(Default, Clone, Copy)]
struct PipelineCounts {
    input: u64,
    poison: u64,
    /// Distinct business keys (payments), entities, or cart lines.
    distinct: u64,
    entities: u64,
    output: u64,
    duplicates: u64,
    stale: u64,
    dead_lettered: u64,
}

impl Report {
    fn anomaly(&mut self, kind: &'static str, example: impl FnOnce() -> String) {
        let n = self.anomalies.entry(kind).or_default();
        *n += 1;
        if *n <= 3 {
            self.examples.push(format!("{kind}: {}", example()));
        }
    }

    /// Records an anomaly found outside the topics (the reconciler's gauge, an instance exit).
    pub fn add(&mut self, kind: &'static str, count: u64, example: String) {
        if count > 0 {
            *self.anomalies.entry(kind).or_default() += count;
            self.examples.push(format!("{kind}: {example}"));
        }
    }

    /// No anomaly of any kind.
    pub fn passed(&self) -> bool {
        self.anomalies.values().all(|n| *n == 0)
    }

    /// Up to three examples of each anomaly.
    pub fn examples(&self) -> &[String] {
        &self.examples
    }

    /// Distinct business events in the input: payment keys, entity versions, cart lines.
    pub fn business_events(&self) -> u64 {
        self.counts.iter().map(|c| c.distinct).sum()
    }

    /// The counts and anomalies, one line.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        let pipelines = format!(
            "payments in {} (keys {}, poison {}) out {} dup {} dlq {} | entities in {} ({} entities, {} versions, poison {}) \
             out {} stale {} dlq {} | carts in {} ({} carts, {} lines, poison {}) out {} dup {} dlq {} | traced events {}",
            c[PAYMENTS].input,
            c[PAYMENTS].distinct,
            c[PAYMENTS].poison,
            c[PAYMENTS].output,
            c[PAYMENTS].duplicates,
            c[PAYMENTS].dead_lettered,
            c[ENTITIES].input,
            c[ENTITIES].entities,
            c[ENTITIES].distinct,
            c[ENTITIES].poison,
            c[ENTITIES].output,
            c[ENTITIES].stale,
            c[ENTITIES].dead_lettered,
            c[CARTS].input,
            c[CARTS].entities,
            c[CARTS].distinct,
            c[CARTS].poison,
            c[CARTS].output,
            c[CARTS].duplicates,
            c[CARTS].dead_lettered,
            self.traced_events,
        );
        let anomalies: Vec<String> = ANOMALIES
            .iter()
            .map(|k| format!("{k} {}", self.anomalies.get(k).copied().unwrap_or(0)))
            .collect();
        format!("{pipelines} | anomalies: {}", anomalies.join(", "))
    }
}

/// Every anomaly kind, in verdict order (all listed, so a zero is visible as a zero).
const ANOMALIES: [&str; 18] = [
    "duplicated outputs",
    "missing keys",
    "ghosts",
    "version order broken",
    "wrong final version",
    "entities without output",
    "merge states off model",
    "DLQ duplicated",
    "DLQ missing",
    "DLQ unexpected",
    "unbalanced pipelines",
    "untraced events",
    "trace ghosts",
    "open events",
    "events closed twice",
    "reconciler open events",
    "instances exited or hung",
    "stalled partitions",
];

/// Reads every topic with read_committed and checks the outputs against the inputs.
pub fn verify(topics: &Topics, max_bytes: usize) -> Report {
    let mut report = Report::default();
    let mut model = Model::default();
    for (i, topic) in topics.inputs.iter().enumerate() {
        scan(topic, |m| model.input(i, m, max_bytes, &mut report.counts[i]));
    }
    report.counts[PAYMENTS].distinct = model.payment_keys.len() as u64;
    report.counts[ENTITIES].entities = model.entities.len() as u64;
    report.counts[ENTITIES].distinct = model.entities.values().map(|e| e.versions.len() as u64).sum();
    report.counts[CARTS].entities = model.carts.len() as u64;
    report.counts[CARTS].distinct = model.carts.values().map(|c| c.len() as u64).sum();

    check_payments(&topics.outputs[PAYMENTS], &model, &mut report);
    check_entities(&topics.outputs[ENTITIES], &model, &mut report);
    check_carts(&topics.outputs[CARTS], &model, &mut report);
    check_dlq(topics, &model, &mut report);
    let outcomes = check_trace(topics, &mut model.events, &mut report);

    // input = out + duplicates + stale + dead-lettered, each term from a different topic: outputs
    // from the output topic, duplicates and stale from the trace, dead letters from the DLQ.
    for (i, name) in PIPELINES.iter().enumerate() {
        let o = outcomes[i];
        let c = &mut report.counts[i];
        (c.duplicates, c.stale) = (o.duplicate, o.stale);
        let c = *c;
        if c.input != c.output + c.duplicates + c.stale + c.dead_lettered || o.completed != c.output {
            report.anomaly("unbalanced pipelines", || {
                format!(
                    "{name}: input {} ≠ out {} + dup {} + stale {} + dlq {} (trace says {} completed)",
                    c.input, c.output, c.duplicates, c.stale, c.dead_lettered, o.completed
                )
            });
        }
    }
    // Where the input fixes the duplicate count (a business key or line counts once), check it.
    for i in [PAYMENTS, CARTS] {
        let c = report.counts[i];
        let expected = c.input - c.poison - c.distinct;
        if c.duplicates != expected {
            report.anomaly("unbalanced pipelines", || {
                format!(
                    "{}: {} duplicates dropped, the input has {expected}",
                    PIPELINES[i], c.duplicates
                )
            });
        }
    }
    report
}

/// What the input topics say must happen.
#[derive(Default)]
struct Model {
    payment_keys: HashSet<String>,
    /// Per entity: its valid versions and their payloads.
    entities: HashMap<String, EntityModel>,
    /// Per cart: each line's payload (the increment merged into the state).
    carts: HashMap<String, BTreeMap<String, Value>>,
    poison: HashSet<Place>,
    /// Every input record, traced or not yet: false until a trace record names it.
    events: HashMap<Place, TraceState>,
}

#[derive(Default)]
struct EntityModel {
    versions: BTreeMap<i64, Vec<Value>>,
}

#[derive(Default, Clone, Copy)]
struct TraceState {
    seen: bool,
    last_terminal: bool,
    terminals: u8,
}

impl Model {
    fn input(&mut self, pipeline: usize, m: &BorrowedMessage<'_>, max_bytes: usize, counts: &mut PipelineCounts) {
        counts.input += 1;
        let place = (pipeline as u8, m.partition(), m.offset());
        self.events.insert(place, TraceState::default());
        let doc = m
            .payload()
            .filter(|b| b.len() <= max_bytes)
            .and_then(|b| serde_json::from_slice::<Value>(b).ok());
        let valid = match doc {
            Some(Value::Object(doc)) => match pipeline {
                PAYMENTS => self.payment(doc),
                ENTITIES => self.entity(doc),
                _ => self.cart(doc),
            },
            _ => false,
        };
        if !valid {
            counts.poison += 1;
            self.poison.insert(place);
        }
    }

    fn payment(&mut self, doc: Map<String, Value>) -> bool {
        let typed = doc
            .get("event_type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with("payment."));
        match (typed, scalar(&doc, "payment_id"), scalar(&doc, "status")) {
            (true, Some(p), Some(s)) => {
                self.payment_keys.insert(tuple_key(&p, &s));
                true
            }
            _ => false,
        }
    }

    fn entity(&mut self, doc: Map<String, Value>) -> bool {
        let typed = doc.get("event_type").and_then(Value::as_str) == Some("entity.updated");
        match (typed, entity_id(&doc), version(&doc)) {
            (true, Some(id), Some(v)) => {
                let payloads = self.entities.entry(id).or_default().versions.entry(v).or_default();
                let doc = Value::Object(doc);
                if !payloads.contains(&doc) {
                    payloads.push(doc);
                }
                true
            }
            _ => false,
        }
    }

    fn cart(&mut self, doc: Map<String, Value>) -> bool {
        let typed = doc.get("event_type").and_then(Value::as_str) == Some("cart.line_added");
        match (typed, scalar(&doc, "cart_id"), scalar(&doc, "line_id")) {
            (true, Some(cart), Some(line)) => {
                self.carts
                    .entry(cart)
                    .or_default()
                    .entry(line)
                    .or_insert(Value::Object(doc));
                true
            }
            _ => false,
        }
    }
}

/// A key field as text: non-empty strings, numbers (as written) and booleans are scalars;
/// absent, null, empty, arrays and objects are not.
fn scalar(doc: &Map<String, Value>, field: &str) -> Option<String> {
    match doc.get(field)? {
        // An empty id would give every such record one key: not a key (the README's rule).
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A business key as the verifier reads it: the tuple of field values, by its own rule (not
/// tally's rendering), so `P:X`+`PAID` and `P`+`X:PAID` are two keys. Debug quoting escapes
/// `"` and `\`, which keeps the pair unambiguous.
fn tuple_key(a: &str, b: &str) -> String {
    format!("{a:?}/{b:?}")
}

fn entity_id(doc: &Map<String, Value>) -> Option<String> {
    Some(tuple_key(&scalar(doc, "entity_type")?, &scalar(doc, "entity_id")?))
}

/// A source version: an integer, or a string holding one.
fn version(doc: &Map<String, Value>) -> Option<i64> {
    match doc.get("version")? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn json(m: &BorrowedMessage<'_>) -> Option<Map<String, Value>> {
    match serde_json::from_slice(m.payload()?) {
        Ok(Value::Object(doc)) => Some(doc),
        _ => None,
    }
}

fn check_payments(topic: &str, model: &Model, report: &mut Report) {
    let mut seen: HashMap<String, u32> = HashMap::new();
    let output = scan(topic, |m| {
        let key = json(m).and_then(|d| Some(tuple_key(&scalar(&d, "payment_id")?, &scalar(&d, "status")?)));
        *seen
            .entry(key.unwrap_or_else(|| "<unreadable output>".into()))
            .or_default() += 1;
    });
    report.counts[PAYMENTS].output = output;
    for (key, n) in &seen {
        if *n > 1 {
            report.anomaly("duplicated outputs", || format!("payment {key} × {n}"));
        }
        if !model.payment_keys.contains(key) {
            report.anomaly("ghosts", || format!("payment {key} has no input"));
        }
    }
    for key in model.payment_keys.iter().filter(|k| !seen.contains_key(*k)) {
        report.anomaly("missing keys", || format!("payment {key}"));
    }
}

fn check_entities(topic: &str, model: &Model, report: &mut Report) {
    let mut last: HashMap<String, (i64, i32)> = HashMap::new();
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    let output = scan(topic, |m| {
        let doc = json(m);
        let Some((id, v)) = doc.as_ref().and_then(|d| Some((entity_id(d)?, version(d)?))) else {
            problems.push((
                "ghosts",
                format!("unreadable entity output at {}/{}", m.partition(), m.offset()),
            ));
            return;
        };
        let genuine = model
            .entities
            .get(&id)
            .and_then(|e| e.versions.get(&v))
            .is_some_and(|payloads| doc.is_some_and(|d| payloads.contains(&Value::Object(d))));
        if !genuine {
            problems.push(("ghosts", format!("{id} v{v} matches no input")));
        }
        match last.insert(id.clone(), (v, m.partition())) {
            Some((before, _)) if before >= v => {
                problems.push(("version order broken", format!("{id}: v{v} after v{before}")))
            }
            Some((_, p)) if p != m.partition() => problems.push((
                "version order broken",
                format!("{id} on partitions {p} and {}", m.partition()),
            )),
            _ => {}
        }
    });
    report.counts[ENTITIES].output = output;
    for (kind, example) in problems {
        report.anomaly(kind, || example);
    }
    for (id, e) in &model.entities {
        let max = e.versions.keys().next_back().copied();
        match last.get(id) {
            None => report.anomaly("entities without output", || id.clone()),
            Some((v, _)) if Some(*v) != max => report.anomaly("wrong final version", || {
                format!("{id} ends at v{v}, input max v{max:?}")
            }),
            Some(_) => {}
        }
    }
}

/// Merge states: per cart, each output grows the previous state by exactly one line, and the
/// last state holds exactly the model's lines.
fn check_carts(topic: &str, model: &Model, report: &mut Report) {
    let mut states: HashMap<String, Vec<Value>> = HashMap::new();
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    let output = scan(topic, |m| {
        let doc = json(m);
        let parsed = doc.as_ref().and_then(|d| {
            let cart = d.get("entity")?.as_str()?.to_string();
            let lines = d.get("lines")?.as_array()?.clone();
            Some((cart, lines, d.get("increments")?.as_u64()?))
        });
        let Some((cart, lines, increments)) = parsed else {
            problems.push((
                "merge states off model",
                format!("unreadable state at {}/{}", m.partition(), m.offset()),
            ));
            return;
        };
        let known = model.carts.get(&cart);
        if known.is_none() {
            problems.push(("ghosts", format!("cart {cart} has no input")));
        }
        for line in &lines {
            let id = line.get("line_id").and_then(Value::as_str).unwrap_or("");
            if known.and_then(|k| k.get(id)) != Some(line) {
                problems.push(("ghosts", format!("{cart}: line {id} not in the input as merged")));
            }
        }
        let previous = states.entry(cart.clone()).or_default();
        let grows_by_one = lines.len() == previous.len() + 1 && lines[..previous.len()] == previous[..];
        if !grows_by_one || increments != lines.len() as u64 {
            problems.push((
                "merge states off model",
                format!(
                    "{cart}: {} lines (increments {increments}) after {}",
                    lines.len(),
                    previous.len()
                ),
            ));
        }
        *previous = lines;
    });
    report.counts[CARTS].output = output;
    for (kind, example) in problems {
        report.anomaly(kind, || example);
    }
    for (cart, lines) in &model.carts {
        let merged: BTreeMap<&str, &Value> = states
            .get(cart)
            .map(|s| {
                s.iter()
                    .map(|l| (l.get("line_id").and_then(Value::as_str).unwrap_or(""), l))
                    .collect()
            })
            .unwrap_or_default();
        let expected: BTreeMap<&str, &Value> = lines.iter().map(|(k, v)| (k.as_str(), v)).collect();
        if merged != expected {
            report.anomaly("merge states off model", || {
                format!(
                    "{cart}: final state has {} lines, the model {}",
                    merged.len(),
                    expected.len()
                )
            });
        }
    }
}

fn check_dlq(topics: &Topics, model: &Model, report: &mut Report) {
    let mut places: HashMap<Place, u32> = HashMap::new();
    let mut unknown = Vec::new();
    scan(&topics.dlq, |m| {
        let source = header_of(m, "tally.source.topic");
        let pipeline = topics.inputs.iter().position(|t| Some(t.as_str()) == source.as_deref());
        let partition = header_of(m, "tally.source.partition").and_then(|p| p.parse().ok());
        let offset = header_of(m, "tally.source.offset").and_then(|o| o.parse().ok());
        match (pipeline, partition, offset) {
            (Some(i), Some(p), Some(o)) => *places.entry((i as u8, p, o)).or_default() += 1,
            _ => unknown.push(format!("{source:?}/{partition:?}/{offset:?}")),
        }
    });
    for u in unknown {
        report.anomaly("DLQ unexpected", || format!("dead letter from an unknown place {u}"));
    }
    for (place, n) in &places {
        report.counts[place.0 as usize].dead_lettered += *n as u64;
        if *n > 1 {
            report.anomaly("DLQ duplicated", || format!("{place:?} × {n}"));
        }
        if !model.poison.contains(place) {
            report.anomaly("DLQ unexpected", || format!("valid record {place:?} dead-lettered"));
        }
    }
    for place in model.poison.iter().filter(|p| !places.contains_key(*p)) {
        report.anomaly("DLQ missing", || format!("poison {place:?}"));
    }
}

/// The first header named `key`, read as bytes (rdkafka's own accessor panics on a header name
/// that is not UTF-8, which the records under test may carry).
fn header_of(m: &BorrowedMessage<'_>, key: &str) -> Option<String> {
    tally::engine::headers::entries(m)
        .find(|h| h.name == key.as_bytes())
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Terminal trace records by outcome, per pipeline.
#[derive(Default, Clone, Copy)]
struct Outcomes {
    completed: u64,
    duplicate: u64,
    stale: u64,
}

/// Every input record has trace records, the last one terminal (COMPLETED or FAILED), and
/// exactly one terminal one: nothing is left open, nothing is closed twice.
fn check_trace(topics: &Topics, events: &mut HashMap<Place, TraceState>, report: &mut Report) -> [Outcomes; 3] {
    let mut outcomes = [Outcomes::default(); 3];
    let mut ghosts = Vec::new();
    scan(&topics.trace, |m| {
        let Some(doc) = json(m) else {
            ghosts.push(format!("unreadable trace record at {}/{}", m.partition(), m.offset()));
            return;
        };
        let event_id = doc.get("event_id").and_then(Value::as_str).unwrap_or("");
        let Some(place) = parse_event_id(event_id, &topics.inputs) else {
            ghosts.push(format!("trace for unknown event {event_id:?}"));
            return;
        };
        let Some(state) = events.get_mut(&place) else {
            ghosts.push(format!("trace for {event_id}, not in the input"));
            return;
        };
        let status = doc.get("status").and_then(Value::as_str).unwrap_or("");
        let terminal = status == "COMPLETED" || status == "FAILED";
        state.seen = true;
        state.last_terminal = terminal;
        if terminal {
            state.terminals = state.terminals.saturating_add(1);
            let o = &mut outcomes[place.0 as usize];
            match (status, doc.get("outcome").and_then(Value::as_str)) {
                ("COMPLETED", None) => o.completed += 1,
                ("COMPLETED", Some("DUPLICATE")) => o.duplicate += 1,
                ("COMPLETED", Some("STALE")) => o.stale += 1,
                _ => {}
            }
        }
    });
    for g in ghosts {
        report.anomaly("trace ghosts", || g);
    }
    for (place, state) in events.iter() {
        if !state.seen {
            report.anomaly("untraced events", || format!("{place:?}"));
        } else if !state.last_terminal {
            report.anomaly("open events", || format!("{place:?}: last trace record not terminal"));
        }
        if state.terminals > 1 {
            report.anomaly("events closed twice", || format!("{place:?} × {}", state.terminals));
        }
    }
    report.traced_events = events.values().filter(|s| s.seen).count() as u64;
    outcomes
}

/// `<topic>/<partition>/<offset>` of an input record, as the trace format defines event ids.
fn parse_event_id(id: &str, inputs: &[String; 3]) -> Option<Place> {
    let (rest, offset) = id.rsplit_once('/')?;
    let (topic, partition) = rest.rsplit_once('/')?;
    let pipeline = inputs.iter().position(|t| t == topic)?;
    Some((pipeline as u8, partition.parse().ok()?, offset.parse().ok()?))
}

/// Calls `f` with every committed record of `topic` (read_committed, from the beginning) up to
/// the end of every partition, skipping the no-open-transaction markers; returns how many.
fn scan(topic: &str, mut f: impl FnMut(&BorrowedMessage<'_>)) -> u64 {
    let (consumer, partitions): (BaseConsumer, usize) = committed_reader(topic, true);
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut at_end: HashMap<i32, bool> = HashMap::new();
    let mut count = 0;
    while at_end.len() < partitions || !at_end.values().all(|e| *e) {
        assert!(Instant::now() < deadline, "reading {topic} took over 15 minutes");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                at_end.insert(m.partition(), false);
                if m.payload() != Some(b"marker".as_slice()) {
                    count += 1;
                    f(&m);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    count
}

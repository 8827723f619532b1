//! The JSON Schema of a topology file, derived from the types the file is read into, for
//! editors (`tally schema > topology.schema.json`; `schema/topology.schema.json` is the copy in
//! the repository). It checks the shape: keys, nesting, scalar types. Everything else (names,
//! templates, durations, limits) is `tally validate`'s, which reports every problem with its
//! line and column.

use super::raw::RawTopology;

/// The schema, as pretty-printed JSON ending in a newline.
pub fn topology_schema() -> String {
    let mut schema = schemars::schema_for!(RawTopology);
    schema.insert("title".into(), "tally topology".into());
    schema.insert(
        "description".into(),
        "A tally topology file: sources, pipelines and their sinks. `${VAR}` and \
         `${VAR:-default}` are replaced from the environment before the file is read, so a \
         number written as `${VAR}` shows here as a string; `tally validate` checks the result."
            .into(),
    );
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}

//! Arbitrary record values and correlation headers through the decision path of every pipeline
//! of the example topologies (`PipelineProcessor::process`, and `rekey` where the pipeline
//! repartitions), against real task stores. Input layout: one byte picks the pipeline, then
//! records separated by 0xFF; within a record, bytes before a 0xFE are the correlation header,
//! the rest the value (0xFF and 0xFE never occur in UTF-8, so JSON mutates freely).
//!
//! Checked: no panic, no store error (it would stop the partition for good), and a rejected
//! record leaves no state behind. Each input ends with an abort, so inputs do not see each
//! other's writes and a crash reproduces from its input alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::sync::Arc;
use tally::processors::{Decision, Input, PipelineProcessor};
use tally::store::global::MappingRecord;
use tally::store::{GlobalMappings, StoreEnv, TaskStore};
use tally_fuzz::fixed_env;

const TOPOLOGIES: [(&str, &str); 5] = [
    ("payments.yaml", include_str!("../../topologies/payments.yaml")),
    ("inventory.yaml", include_str!("../../topologies/inventory.yaml")),
    ("entity-sync.yaml", include_str!("../../topologies/entity-sync.yaml")),
    ("cart-merge.yaml", include_str!("../../topologies/cart-merge.yaml")),
    ("crm-to-erp.yaml", include_str!("../../topologies/crm-to-erp.yaml")),
];

/// One pipeline of an example topology with its task's stores.
struct Stage {
    processor: PipelineProcessor,
    store: TaskStore,
}

struct World {
    stages: Vec<Stage>,
    _dir: tempfile::TempDir,
}

fn world() -> World {
    let dir = tempfile::tempdir().expect("a temporary directory for the stores");
    let env = StoreEnv::new(8 << 20, 4 << 20);
    // Some known mappings, so `map_ids` takes its "found" path as well as pending-create.
    let global = Arc::new(GlobalMappings::in_memory().expect("an in-memory ID-mapping store"));
    let known = [
        ("ext/crm/C1", "11111111-1111-5111-8111-111111111111"),
        ("int/11111111-1111-5111-8111-111111111111/erp", "ERP-1"),
    ];
    let records: Vec<MappingRecord<'_>> = known
        .iter()
        .enumerate()
        .map(|(offset, (key, value))| MappingRecord {
            partition: 0,
            offset: offset as i64,
            key,
            value: Some(value),
        })
        .collect();
    global.apply(&records).expect("the in-memory store takes the known mappings");
    let mut stages = Vec::new();
    for (file, text) in TOPOLOGIES {
        let topology = tally::config::load_str(file, text, fixed_env).expect("example topologies are valid");
        for pipeline in topology.pipelines {
            let path = dir.path().join(format!("{file}-{}", pipeline.name));
            let store = TaskStore::open(&path, &pipeline.store_names(), &env).expect("the task store opens");
            let processor = PipelineProcessor::new(
                Arc::new(pipeline),
                topology.processing.max_record_bytes,
                Arc::clone(&global),
            );
            stages.push(Stage { processor, store });
        }
    }
    World { stages, _dir: dir }
}

thread_local! {
    static WORLD: RefCell<World> = RefCell::new(world());
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, records)) = data.split_first() else {
        return;
    };
    WORLD.with_borrow_mut(|world| {
        let count = world.stages.len();
        let stage = &mut world.stages[usize::from(pick) % count];
        for (i, record) in records.split(|&b| b == 0xFF).enumerate() {
            let (header, payload) = match record.iter().position(|&b| b == 0xFE) {
                Some(at) => (std::str::from_utf8(&record[..at]).ok(), &record[at + 1..]),
                None => (None, record),
            };
            let offset = i64::try_from(i).unwrap_or(i64::MAX);
            let input = Input {
                payload: Some(payload),
                correlation_header: header,
                coordinates: ("fuzz", 0, offset),
                // An hour apart, so short retentions can expire within one input.
                now_ms: 1_700_000_000_000 + offset * 3_600_000,
            };
            if stage.processor.pipeline().repartition.is_some() {
                let _ = stage.processor.rekey(&input, true);
            }
            let processed = stage
                .processor
                .process(&input, &mut stage.store)
                .expect("a record never causes a store error");
            let changes = stage.store.take_changes();
            if matches!(processed.decision, Decision::Reject(_)) {
                assert!(changes.is_empty(), "a rejected record leaves no state: {changes:?}");
            }
        }
        stage.store.abort();
    });
});

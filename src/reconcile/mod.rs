//! Reconciliation: proof from what was sent and what was processed that nothing was lost.

pub mod files;
pub mod ledger;
pub mod offline;
pub mod progress;
pub mod records;
pub mod report;
pub mod topic;

//! Reconciliation: proving nothing was lost, live (events stuck unfinished on the trace topic)
//! and offline (what upstream sent against what was processed).

pub mod counted_key;
pub mod csv_file;
pub mod files;
pub mod ledger;
pub mod live;
pub mod offline;
pub mod progress;
pub mod record_cap;
pub mod records;
pub mod report;
pub mod report_file;
pub mod sent_key;
pub mod topic;
pub mod watch;
pub mod window;

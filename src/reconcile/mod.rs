//! Reconciliation: proving nothing was lost, live (events stuck unfinished) and offline
//! (what upstream sent against what was processed).

pub mod live;

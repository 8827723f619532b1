//! tally: exactly-once business-key deduplication for Kafka integration pipelines.

pub mod commands;
pub mod config;
pub mod demo;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod processors;
pub mod queries;
pub mod reconcile;
pub mod recover;
pub mod store;
pub mod topology;
pub mod trace;
pub mod wire;

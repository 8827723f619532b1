//! A stream thread's transaction: its state ([`state`]) and the protocol that commits, aborts,
//! rewinds and poisons it ([`protocol`]), written against two small traits so that every
//! transition can be tested without a broker (`protocol/tests.rs`).
//!
//! What happens when a commit fails is decided in [`protocol`], from the error's class and the
//! step it came from ([`crate::engine::errors::recovery`]).

pub mod protocol;
pub mod state;

pub use protocol::{Clients, CommitFailure, Delivered, Outcome, Tasks};
pub use state::{Partition, Phase, Txn};

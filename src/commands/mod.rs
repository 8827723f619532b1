//! The CLI's commands, called by `main` with parsed arguments.

pub mod acknowledge;
pub mod describe;
pub mod inspect;
pub mod logging;
pub mod reconcile;
pub mod redrive;
pub mod reset;
pub mod run;
pub mod validate;

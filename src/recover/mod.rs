//! Recovery tools for the operator: what to do once the reconciler found something.

pub mod acknowledge;
pub mod inspect;
pub mod redrive;
pub mod reset;
pub mod state;
pub mod surgery;

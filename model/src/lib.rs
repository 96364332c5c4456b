//! A model-checked version of Tenure's fencing protocol (issue 24).
//!
//! [`model::Tenure`] is a Stateright [`stateright::Model`] of etcd (leases,
//! lock keys, revisions), PostgreSQL (job rows, claim, admission, step CAS, row
//! lock), NATS (at-least-once redelivery) and the workers' job actors; each
//! [`Action`] names the `framework/src` function it stands for.
//! [`check()`] runs a breadth-first check to a depth bound, [`render`] prints a
//! counterexample as numbered lines, [`variants`] holds the weakened protocols,
//! and [`liveness`] checks that every job can always still finish.
//!
//! ```text
//! cargo test -p tenure-model                                  # the bound `make test` checks
//! cargo run --release -p tenure-model --example check         # the same, with traces
//! cargo run --release -p tenure-model --example check -- faithful steps=3 expiries=2
//! ```
//!
//! `model/README.md` lists what is modelled and what is not, the properties,
//! the bounds with their measured sizes and times, and what the checks found.

pub mod check;
pub mod liveness;
pub mod model;
mod partition;
pub mod trace;
pub mod variants;

pub use check::{Outcome, check};
pub use model::{Action, Bound, EqualToken, Mode, PartitionFence, State, Switches, Tenure, props};
pub use trace::render;

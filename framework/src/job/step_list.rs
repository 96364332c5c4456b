//! Step-list versions: whether a worker's definition of a job type may resume
//! a job row, given the step names the row recorded and how many steps
//! committed.
//!
//! A job row records the step names of the definition it was enqueued with
//! (see [`JobRow::step_names`](crate::JobRow::step_names)). A definition *fits*
//! a row when
//! * the steps already committed are the same steps, in the same order, at the
//!   start of the definition (a renamed or reordered committed step would feed
//!   a checkpoint into the wrong code), and
//! * the definition is not shorter than the recorded list (it would end the job
//!   before steps it was enqueued with).
//!
//! So appending steps, and changing steps not committed yet, fit; a row with no
//! recorded list (enqueued by name, or before step lists were recorded) fits
//! every definition and records the first claimer's.
//!
//! The rules themselves live in a lower module (`crate::steps`, which `fence`
//! uses too); this module keeps their public path.

pub use crate::steps::fingerprint;

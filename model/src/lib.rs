//! A model-checked version of Tenure's fencing protocol (issue 24).
//!
//! See `model/README.md` for what the model covers, the bounds checked and how
//! to run larger ones.

pub mod check;
pub mod liveness;
pub mod model;
pub mod trace;
pub mod variants;

pub use check::{Outcome, check};
pub use model::{Action, Bound, EqualToken, State, Switches, Tenure, props};
pub use trace::render;

//! # `tenure::testing`: test your own jobs against real servers and real faults
//!
//! **For tests only** (feature `testing`; what needs servers also needs
//! `devstack`). Never enable these features in a production build.
//!
//! * [`#[tenure::test]`](crate::test) (feature `devstack`): an async test that
//!   gets a `TestEnv`: the dev stack (shared by the test binary, or its
//!   own), a fresh namespace and schema, migrated, a [`Client`](crate::Client)
//!   and a [`Config`](crate::Config), and ways to start workers in process
//!   (`TestEnv::worker`) or as child processes (`TestEnv::worker_process`).
//! * [`FaultPlan`]: faults at named points of your own jobs ("at job X, step k,
//!   after the commit: crash"), applied by the runtime at those points.
//! * [`History`]: every committed and every refused step (a
//!   [`WorkerObserver`](crate::WorkerObserver)), and [`History::check`], which
//!   reports double commits, token regressions, stale writes in your tables and
//!   jobs neither done nor dead-lettered.
//!
//! The guide [`guide::testing`](crate::guide::testing) walks through a
//! complete example.

mod history;

#[cfg(feature = "devstack")]
mod env;
#[cfg(feature = "devstack")]
mod process;
#[cfg(feature = "devstack")]
mod proxy;
#[cfg(feature = "devstack")]
mod spec;
#[cfg(feature = "devstack")]
mod step;

pub use crate::faults::{Fault, FaultHit, FaultPlan, FaultPoint, FaultRule, Injector};
#[cfg(feature = "devstack")]
pub use env::{TestEnv, TestResult};
pub use history::{CheckError, History, Report, StepRecord, Violation, judge_commits};
#[cfg(feature = "devstack")]
pub use process::WorkerProcess;
#[cfg(feature = "devstack")]
pub use proxy::Relay;
#[cfg(feature = "devstack")]
pub use spec::{TestError, short_backoffs};

/// Used by the code `#[tenure::test]` generates. Not a public API.
#[cfg(feature = "devstack")]
#[doc(hidden)]
pub use env::run as __run;
#[cfg(feature = "devstack")]
#[doc(hidden)]
pub use spec::{TestSpec, WorkerFn};

//! Building blocks: the protocol's parts, for tools and advanced users.
//!
//! An application needs none of this: it uses the crate root ([`Worker`](crate::Worker),
//! [`Client`](crate::Client), [`Config`](crate::Config), [`Job`](crate::Job),
//! [`StepCtx`](crate::StepCtx), ...). These modules are what the runtime is made of,
//! public for tools that work below it: the `tenure` CLI and its web view, Tenure's own
//! protocol tests and benchmarks, and services that build their own worker loop.
//!
//! Each module is the only code that talks to its server:
//! - [`lease`]: sessions, job locks and fencing tokens in etcd;
//! - [`fence`]: job rows, fenced transactions and guard triggers in PostgreSQL;
//! - [`queue`]: JetStream delivery, enqueue idempotency and the dead-letter stream in NATS.
//!
//! Using them directly gives up what the runtime guarantees on top (a step's
//! checkpoint and writes in one fenced transaction, acks after commits, the
//! watchdog). Their signatures may change in a minor release more readily than the
//! crate root's; `ARCHITECTURE.md` lists every public item and why it is public.

pub mod fence;
pub mod lease;
pub mod queue;

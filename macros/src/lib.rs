//! Procedural macros for [`tenure`](https://docs.rs/tenure). Use them through the
//! `tenure` crate (`#[tenure::job]`, `#[tenure::step]`), not directly.
//!
//! This crate is a shim: each attribute hands off to one function in `expand`;
//! parsing (`args`, `parse`, `signature`), type-continuity checks (`chain`) and code
//! generation are ordinary, unit-tested modules.

use proc_macro::TokenStream;

mod args;
mod chain;
mod errors;
mod expand;
mod parse;
mod signature;
mod test_attr;
mod timeout;

/// Turns an `impl` block of `#[step]` methods into a job type: implements
/// [`tenure::Job`](https://docs.rs/tenure/latest/tenure/job/trait.Job.html) for it.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tenure::{Job, StepCtx, StepError};
/// use tenure::job::StepInfo;
///
/// #[derive(Serialize, Deserialize)]
/// pub struct TransferReq { pub from: String, pub to: String, pub cents: u64 }
/// #[derive(Serialize, Deserialize)]
/// pub struct Reserved { pub hold: u64 }
/// #[derive(Serialize, Deserialize)]
/// pub struct Debited { pub entry: u64 }
///
/// /// The job's shared state: one value serves every running transfer.
/// pub struct Transfer { /* e.g. a client handle */ }
///
/// #[tenure::job(name = "ledger.transfer", max_takeovers = 5, retries = 3)]
/// impl Transfer {
///     #[step]
///     async fn reserve(&self, ctx: &mut StepCtx, input: TransferReq) -> Result<Reserved, StepError> {
///         let _key = ctx.idempotency_key("hold"); // same for every owner and retry
///         Ok(Reserved { hold: input.cents })
///     }
///
///     #[step]
///     async fn debit(&self, _ctx: &mut StepCtx, r: Reserved) -> Result<Debited, StepError> {
///         Ok(Debited { entry: r.hold })
///     }
///
///     #[step]
///     async fn notify(&self, _ctx: &mut StepCtx, _d: Debited) -> Result<(), StepError> {
///         Ok(())
///     }
///
///     // Methods without #[step] stay ordinary methods.
///     fn helper(&self) {}
/// }
///
/// assert_eq!(<Transfer as Job>::NAME, "ledger.transfer");
/// assert_eq!(
///     Transfer::STEPS,
///     &[StepInfo { name: "reserve" }, StepInfo { name: "debit" }, StepInfo { name: "notify" }]
/// );
/// assert_eq!(Transfer::MAX_TAKEOVERS, Some(5));
/// assert_eq!(Transfer::RETRIES, Some(3));
/// ```
///
/// # Arguments
/// - `name = "..."` (required): the job type's stable name, stored in job rows and
///   message headers. ASCII letters, digits, `_` and `-`, in non-empty parts
///   separated by `.`.
/// - `max_takeovers = N` (optional, `u32`): lost owners tolerated before the job is
///   dead-lettered; default: the worker's `Config`.
/// - `retries = N` (optional, `u32`): failed attempts tolerated before the job is
///   dead-lettered; default: the worker's `Config`.
/// - `step_timeout = "30s"` (optional): the time limit of every step that has
///   none of its own (see `#[step(timeout)]` below); default: none.
///
/// # Steps
/// Every method marked `#[step]` is a step, in declaration order, named after the
/// method. A step has exactly this shape:
///
/// ```text
/// async fn name(&self, ctx: &mut StepCtx, input: T) -> Result<U, E>
/// ```
///
/// - `T` is the job's input for the first step, and the previous step's `U` for
///   every other; `U` of the last step is the job's output. `T` must be
///   `DeserializeOwned` and `U` `Serialize`: they are the checkpoints.
/// - `E` is [`StepError`](https://docs.rs/tenure/latest/tenure/job/struct.StepError.html)
///   or any error that converts into it with `?` (every `std::error::Error +
///   Send + Sync + 'static`, which becomes a retryable error).
/// - `ctx` may be spelled `&mut StepCtx`, `&mut tenure::StepCtx`, ... (any path
///   ending in `StepCtx`).
/// - The future of a step must be `Send` (steps run on a multi-threaded runtime).
///
/// A step may have a time limit: `#[step(timeout = "30s")]` (a whole number and
/// `ms`, `s`, `m` or `h`). A step still running at its limit is stopped at its
/// next `.await`, its transaction rolled back, and the attempt fails as a
/// retryable error (`on_timeout = "retryable"`, the default) or dead-letters the
/// job (`#[step(timeout = "30s", on_timeout = "permanent")]`); a job that dies of
/// it is dead-lettered as `timeout`. See `tenure::job::StepTimeout`.
///
/// # Generated code
/// The impl block is kept as written, minus the `#[step]` markers (each step gets
/// `#[allow(clippy::unused_async, clippy::needless_pass_by_ref_mut)]` instead: its
/// shape is fixed even when it does not await or mutate `ctx`), and the macro
/// adds the `Job` impl exactly as one would write it by hand (see the `Job` trait's
/// documentation for a full hand-written job). For the example above:
///
/// ```text
/// const _: () = {
///     impl ::tenure::Job for Transfer {
///         type Input = TransferReq;        // the first step's input
///         type Output = ();                // the last step's output
///         const NAME: &'static str = "ledger.transfer";
///         const STEPS: &'static [StepInfo] = &[
///             StepInfo { name: "reserve" }, StepInfo { name: "debit" }, StepInfo { name: "notify" },
///         ];
///         const MAX_TAKEOVERS: Option<u32> = Some(5);
///         const RETRIES: Option<u32> = Some(3);
///
///         fn run_step<'a>(&'a self, step: StepIndex, ctx: &'a mut StepCtx, input: serde_json::Value)
///             -> BoxFuture<'a, Result<serde_json::Value, StepError>>
///         {
///             match step.get() {
///                 0 => Box::pin(async move {
///                     let input = ::tenure::job::decode_checkpoint::<TransferReq>(step, input)?;
///                     let output = Self::reserve(self, ctx, input).await?;
///                     ::tenure::job::encode_checkpoint::<Reserved>(step, &output)
///                 }),
///                 1 => Box::pin(async move { /* debit: Reserved -> Debited */ }),
///                 2 => Box::pin(async move { /* notify: Debited -> () */ }),
///                 _ => Box::pin(std::future::ready(Err(StepError::no_such_step::<Self>(step)))),
///             }
///         }
///     }
/// };
/// ```
///
/// When two consecutive types are not spelled the same (`Reserved` then
/// `crate::Reserved`), the macro also emits a zero-cost trait-bound check so that
/// rustc reports a mismatch at the later step's input type, naming both steps.
///
/// # Errors
/// Misuse is a compile error with the span of the offending tokens, never a
/// panic; every problem is reported at once: unknown, duplicate or malformed
/// arguments, a missing `name`; the attribute on anything but an inherent,
/// non-generic impl block; no steps; a step that is not `async`, does not take
/// `&self`, `ctx: &mut StepCtx` and one owned input, or does not return
/// `Result<U, E>`; `#[cfg]` on a step; duplicate steps; consecutive steps whose
/// types do not chain.
#[proc_macro_attribute]
pub fn job(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::job(attr.into(), item.into()).into()
}

/// Marks a step inside a `#[tenure::job]` impl block (see [`macro@job`]).
///
/// `#[tenure::job]` removes these markers; on its own, outside such an impl
/// block, `#[step]` is a compile error.
#[proc_macro_attribute]
pub fn step(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::step(attr.into(), item.into()).into()
}

/// An async test of your own jobs against real servers: see
/// [`tenure::testing`](https://docs.rs/tenure/latest/tenure/testing/) and the
/// guide "Testing your jobs". Needs tenure's `testing` and `devstack` features
/// (in `[dev-dependencies]`: for tests only).
///
/// ```text
/// #[tenure::test]                        // lease TTL 10 s, the binary's shared dev stack
/// #[tenure::test(ttl_secs = 3)]          // a short TTL, for tests about lease loss
/// #[tenure::test(worker = my_workers)]   // env.worker_process(..) runs my_workers(cfg)
/// #[tenure::test(own_stack)]             // servers of its own (to restart PostgreSQL)
/// #[tenure::test(partitions = 4)]        // the namespace owns jobs by partition (4)
/// async fn name(env: tenure::testing::TestEnv) { .. }   // or -> Result<(), E: Debug>
/// ```
///
/// The test gets a [`TestEnv`](https://docs.rs/tenure/latest/tenure/testing/struct.TestEnv.html):
/// a namespace and PostgreSQL schema of its own, migrated, a client, a config,
/// a history checker, and workers on demand. `worker = path` names a
/// `async fn(tenure::Config) -> tenure::WorkerBuilder` that registers the jobs a
/// worker process runs (the test binary re-runs itself as that worker).
///
/// # Errors
/// Misuse is a compile error at the offending tokens, all reported at once:
/// a function that is not `async`, is generic, or does not take exactly one
/// argument; unknown, duplicate or malformed arguments; another `#[test]`
/// attribute on the function.
#[proc_macro_attribute]
pub fn test(attr: TokenStream, item: TokenStream) -> TokenStream {
    test_attr::test(attr.into(), item.into()).into()
}

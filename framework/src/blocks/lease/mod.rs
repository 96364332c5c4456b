//! Sessions, job locks and fencing tokens: the only code that talks to etcd.
//!
//! A [`Session`] is one etcd lease per worker process, kept alive in the
//! background, with a watchable [`Health`]. A [`JobLock`] is the key
//! `<namespace>/jobs/<job_id>`, created under the session's lease only if absent;
//! its `create_revision` is the job's [`FencingToken`].
//!
//! ```no_run
//! # async fn demo(cfg: tenure::Config, job: tenure::JobId) -> Result<(), tenure::blocks::lease::LeaseError> {
//! use tenure::blocks::lease::{Acquire, Health, Session};
//!
//! let session = Session::establish(&cfg).await?;
//! assert_eq!(session.health(), Health::Healthy);
//! match session.acquire(job).await? {
//!     Acquire::Acquired(lock) => {
//!         // Claim the fence at the resource with `lock.token()` before any work,
//!         // bind all I/O to `session.cancellation()`, then:
//!         lock.release(&session).await?;
//!     }
//!     Acquire::Contended { holder } => println!("held by {holder:?}; retry later"),
//! }
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! # Health
//! Keepalive requests go out on etcd's bidi keepalive stream. Each acknowledgement
//! is stamped with the instant its request was sent (monotonic clock), so the
//! lease is known to live at least until `stamp + TTL`:
//! - `Healthy` -> `Degraded` when no keepalive was acknowledged within TTL/3;
//! - `Degraded` -> `Healthy` when an acknowledgement arrives within TTL/3 of its
//!   request's stamp;
//! - any -> `Lost` when no acknowledgement by 70% of the TTL, when etcd answers a
//!   keepalive with `ttl <= 0` (the lease was revoked or expired), or when the
//!   keepalive stream ends or fails. `Lost` is terminal: make a new session with
//!   [`Session::establish_with_backoff`].
//!
//! Requests are sent every TTL/6, twice per `Degraded` window: sending exactly
//! every TTL/3 would turn `Degraded` for one round trip in every period.
//!
//! On `Lost` the session's [`CancellationToken`] is cancelled, or, with
//! [`WatchdogPolicy::AbortProcess`], the process aborts at once. The keeper then
//! tries once to revoke the lease so the worker's job locks go at once rather
//! than at TTL expiry.
//!
//! [`WatchdogPolicy::AbortProcess`]: crate::config::WatchdogPolicy::AbortProcess
//! [`CancellationToken`]: tokio_util::sync::CancellationToken
//!
//! # Fencing
//! The token is the lock key's `create_revision`: etcd's one global, durable,
//! strictly increasing revision, so every new owner of a job holds a larger token
//! than every earlier owner, across leader changes. After every create the key is
//! re-read linearizably and must still carry this session's lease (etcd issue
//! 11456: a put on a lease being revoked); otherwise the acquisition fails with
//! [`LeaseError::LockLostBeforeVerify`]. The lock alone proves nothing at the
//! resource: the resource must compare the token.
//!
//! [`FencingToken`]: crate::FencingToken

mod access;
mod batch;
mod error;
mod fleet;
mod health;
mod keepalive;
mod leader;
mod lock;
mod partition;
mod plan;
mod request;
mod service;
mod session;

pub use access::connect_options as etcd_connect_options;
pub use batch::MAX_BATCH;
pub use error::{LeaseError, LostReason};
pub(crate) use fleet::{FleetKey, FleetTake};
pub use health::Health;
pub(crate) use leader::{Campaign, Leadership};
pub use lock::{Acquire, JobLock};
pub use partition::{Member, OwnershipView, PartitionOwner};
pub(crate) use service::{Coming, LockService, ReleaseMode};
pub use session::Session;

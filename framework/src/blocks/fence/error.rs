//! [`FenceError`]: everything the fence can refuse, kept apart by cause, and
//! [`classify`]: the one place where a database error's SQLSTATE or text is read.

use crate::security::{AccessError, AccessStep, Server, error_chain, tls_failure};
use crate::types::{JobId, ObservedFence, StepIndex};

use super::sql::CAS_REFUSED_SQLSTATE;
use super::status::{JobStatus, WrongState};

/// The SQLSTATE the guard trigger raises when it refuses a write
/// (see [`FenceStore::install_guard`](super::FenceStore::install_guard)).
///
/// Code that writes guarded tables with its own error type can test for it with
/// [`is_guard_refusal`].
pub const GUARD_SQLSTATE: &str = "TF001";

/// Whether `err` is the guard trigger refusing a write (SQLSTATE [`GUARD_SQLSTATE`]).
///
/// ```
/// let err = sqlx::Error::RowNotFound;
/// assert!(!tenure::blocks::fence::is_guard_refusal(&err));
/// ```
pub fn is_guard_refusal(err: &sqlx::Error) -> bool {
    classify(err) == PgFailure::GuardRefused
}

/// The SQLSTATE of an insert refused because the job's row was pruned while
/// the insert waited (its tombstone keeps the key used; migration 0014).
pub(super) const TOMBSTONED_SQLSTATE: &str = "TF003";

/// The SQLSTATE of the walls on `jobs` (migration 0015): a write that breaks
/// the protocol whoever makes it (a fence that goes down, a terminal row that
/// reopens, a new job that is not `pending` with fence 0).
pub(super) const WALL_SQLSTATE: &str = "TF004";

/// Whether `err` is an insert refused by the job's tombstone
/// ([`TOMBSTONED_SQLSTATE`]): the insert path looks again and finds it.
pub(super) fn is_tombstoned(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.code().as_deref() == Some(TOMBSTONED_SQLSTATE))
}

/// Whether `err` says the statement's session was gone before the statement
/// could run: the server ended it (`57P01` an operator's
/// `pg_terminate_backend` or a shutdown, `57P02` a crash of another backend),
/// or the socket was closed or reset under it. The checkout's ping catches
/// most such sessions; one ended between the ping and the statement shows up
/// here, and the idempotent paths (a row's insert, the reads by id, the
/// probe) run the statement once more on a fresh connection.
pub(super) fn is_session_ended(err: &sqlx::Error) -> bool {
    use std::io::ErrorKind as K;
    match err {
        sqlx::Error::Database(d) => matches!(d.code().as_deref(), Some("57P01" | "57P02")),
        sqlx::Error::Io(e) => matches!(
            e.kind(),
            K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
        ),
        _ => false,
    }
}

/// The SQLSTATE a Tenure function raises for arguments outside what its
/// caller may ask (migration 0016): a prune age below the schema's
/// `prune_floor`, a batch outside 1 to [`MAX_PRUNE_BATCH`](crate::config::MAX_PRUNE_BATCH),
/// a worker report's or a refusal record's values that cannot be true.
pub const ARGUMENT_REFUSED_SQLSTATE: &str = "TF020";

/// The SQLSTATE of a leader's ticks refused because their schedule is paused
/// (`tenure_advance_schedule`, migration 0020): the transaction that inserted
/// them rolls back.
pub(super) const SCHEDULE_PAUSED_SQLSTATE: &str = "TF021";

/// What a database error means to the fence, as far as it acts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PgFailure {
    /// The guard trigger refused a write (SQLSTATE [`GUARD_SQLSTATE`]).
    GuardRefused,
    /// `tenure_step_cas` matched no row (SQLSTATE `TF002`): the step commit was
    /// refused, and the rest of its simple-query string skipped.
    CasRefused,
    /// A wall on `jobs` refused the write (SQLSTATE [`WALL_SQLSTATE`]).
    WallRefused,
    /// A Tenure function refused its arguments ([`ARGUMENT_REFUSED_SQLSTATE`]).
    ArgumentRefused,
    /// A paused schedule's ticks refused ([`SCHEDULE_PAUSED_SQLSTATE`]).
    SchedulePaused,
    /// PostgreSQL refused us: TLS, the password or `pg_hba.conf`, a privilege.
    Refused {
        /// Where it was refused.
        step: AccessStep,
        /// The reason, plainly (the server's message for a SQLSTATE).
        detail: String,
    },
    /// Anything else: I/O, timeout, contention, a constraint.
    Other,
}

/// Reads `err` once and names what it means to the fence. Every look at a
/// database error's SQLSTATE or text happens here: Tenure's own SQLSTATEs
/// (`TF001` from the guard, `TF002` from the step CAS), the SQLSTATEs and messages
/// of a refused login or privilege, and the TLS failure in a TLS or I/O error's
/// text. The three kinds cannot meet in one error (a SQLSTATE comes only with
/// a database error, and each SQLSTATE names one kind).
pub(super) fn classify(err: &sqlx::Error) -> PgFailure {
    let code = err.as_database_error().and_then(|d| d.code());
    match code.as_deref() {
        Some(GUARD_SQLSTATE) => return PgFailure::GuardRefused,
        Some(CAS_REFUSED_SQLSTATE) => return PgFailure::CasRefused,
        Some(WALL_SQLSTATE) => return PgFailure::WallRefused,
        Some(ARGUMENT_REFUSED_SQLSTATE) => return PgFailure::ArgumentRefused,
        Some(SCHEDULE_PAUSED_SQLSTATE) => return PgFailure::SchedulePaused,
        _ => {}
    }
    let refused = match err {
        sqlx::Error::Tls(e) => {
            let text = format!("{} {e:?}", error_chain(e.as_ref()));
            let plain = tls_failure(&text).map_or_else(|| error_chain(e.as_ref()), str::to_string);
            Some((AccessStep::Tls, plain))
        }
        sqlx::Error::Database(d) => by_sqlstate(d.code().as_deref(), d.message()),
        sqlx::Error::Io(e) => {
            tls_failure(&format!("{e} {e:?}")).map(|plain| (AccessStep::Tls, plain.to_string()))
        }
        _ => None,
    };
    match refused {
        Some((step, detail)) => PgFailure::Refused { step, detail },
        None => PgFailure::Other,
    }
}

/// The refusal a SQLSTATE (and, for `28000`, the message) names. Part of
/// [`classify`].
fn by_sqlstate(code: Option<&str>, message: &str) -> Option<(AccessStep, String)> {
    let step = match code? {
        "28P01" => AccessStep::Authenticate,
        "28000" if message.contains("no encryption") => {
            return Some((
                AccessStep::Tls,
                format!("the server requires TLS ({message})"),
            ));
        }
        "28000" if message.contains("certificate") => AccessStep::Tls,
        "28000" => AccessStep::Authenticate,
        "42501" => AccessStep::Authorize,
        _ => return None,
    };
    Some((step, message.to_string()))
}

/// Errors of the fence. Tokens in an error are reports ([`ObservedFence`]): an
/// error never hands out a [`FencingToken`](crate::FencingToken).
///
/// Four families the caller must keep apart:
/// * **stale** ([`FenceError::is_fenced_out`]): [`FencedOut`](FenceError::FencedOut)
///   and [`GuardRefused`](FenceError::GuardRefused): a newer generation owns the job
///   (or the write came from no generation at all). Stop; never retry the write.
/// * **state** ([`Terminal`](FenceError::Terminal), [`NotFound`](FenceError::NotFound),
///   [`Released`](FenceError::Released), [`NotClaimed`](FenceError::NotClaimed),
///   [`StepMismatch`](FenceError::StepMismatch), [`NotDead`](FenceError::NotDead),
///   [`PayloadConflict`](FenceError::PayloadConflict)): the row is not in the state
///   the call needs.
/// * **alarm** ([`TokenRegression`](FenceError::TokenRegression),
///   [`FenceError::is_token_regression`]): etcd issued a token twice; the job is
///   handed back and an operator must look.
/// * **infrastructure** ([`Db`](FenceError::Db), [`Migrate`](FenceError::Migrate)):
///   I/O, contention, timeouts; the outcome of a commit may be unknown, and a retry
///   under the same token is safe (the fence decides again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// Zero rows: a newer generation has claimed the job (`current > ours`).
    #[error("job {job_id}: fenced out, token {ours} is stale (current fence {current:?})")]
    FencedOut {
        /// The job.
        job_id: JobId,
        /// Our token.
        ours: ObservedFence,
        /// The row's fence now (`None` when it was never claimed).
        current: Option<ObservedFence>,
    },
    /// The guard trigger refused a write to a guarded table (SQLSTATE
    /// [`GUARD_SQLSTATE`]): outside a fenced transaction, or from a stale generation.
    #[error("guard refused the write: {message}")]
    GuardRefused {
        /// The database's message (names the table, the job and the fences).
        message: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A wall on `jobs` refused a write that breaks the protocol, whoever made
    /// it (SQLSTATE `TF004`, migration 0015): a fence that goes down, a `done`
    /// or `cancelled` row that reopens, a `dead` row reopened other than by
    /// [`FenceStore::reset_for_redrive`](super::FenceStore::reset_for_redrive), a new job that is
    /// not `pending` with fence 0. Nothing of the statement was written.
    #[error("refused by the protocol: {message}")]
    ProtocolRefused {
        /// The database's message (names the job and what was refused).
        message: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// The alarm: a claim on a freshly acquired lock found the row's fence *equal*
    /// to its token. etcd handed out a revision it had handed out before (a
    /// snapshot restored without `--bump-revision`), so another owner may hold the
    /// same token. Never work around it: hand the job back, never run it.
    #[error(
        "job {job_id}: token {token} was already claimed by an earlier owner; \
         etcd revisions went backwards (snapshot restore without --bump-revision?)"
    )]
    TokenRegression {
        /// The job.
        job_id: JobId,
        /// Our token, equal to the row's fence.
        token: ObservedFence,
    },
    /// The job row does not exist.
    #[error("job {0} not found")]
    NotFound(JobId),
    /// An operator's retry-now or reschedule found the job in a state it
    /// does not apply to ([`FenceStore::retry_now`](super::FenceStore::retry_now),
    /// [`FenceStore::reschedule`](super::FenceStore::reschedule)); nothing
    /// changed.
    #[error("job {job_id} is {state}")]
    WrongState {
        /// The job.
        job_id: JobId,
        /// What it is instead.
        state: WrongState,
    },
    /// The job is `done`, `dead` or `cancelled`: there is nothing left to claim or write.
    #[error("job {job_id} is {status}")]
    Terminal {
        /// The job.
        job_id: JobId,
        /// Its terminal status.
        status: JobStatus,
    },
    /// The row's fence is below our token: our claim never committed (a
    /// [`claim_and_begin`](super::FenceStore::claim_and_begin) transaction that was
    /// dropped), so this token has no standing at the resource.
    #[error("job {job_id}: token {ours} never claimed the row (fence {current:?})")]
    NotClaimed {
        /// The job.
        job_id: JobId,
        /// Our token.
        ours: ObservedFence,
        /// The row's fence now.
        current: Option<ObservedFence>,
    },
    /// Our generation released the job (retry, graceful shutdown, or it was marked
    /// dead by the operator path) and may not write any more.
    #[error("job {job_id}: generation {token} already released the job")]
    Released {
        /// The job.
        job_id: JobId,
        /// Our token (still the row's fence).
        token: ObservedFence,
    },
    /// The fence is ours but the row is at another step: this step was already
    /// committed (a duplicate) or the caller skipped one.
    #[error(
        "job {job_id}: step {expected} requested under token {token}, the row is at step {actual}"
    )]
    StepMismatch {
        /// The job.
        job_id: JobId,
        /// Our token.
        token: ObservedFence,
        /// The step the caller asked for.
        expected: StepIndex,
        /// The row's step.
        actual: StepIndex,
    },
    /// [`insert_job`](super::FenceStore::insert_job) under an existing id with another
    /// payload or job type (a re-enqueue never overwrites).
    #[error("job {job_id} exists with another job type or payload")]
    PayloadConflict {
        /// The job.
        job_id: JobId,
    },
    /// A cancel of a dead job whose `on_dead` compensation has not ended
    /// (migration 0011's `compensation = 'pending'`); nothing changed.
    #[error("job {0} is dead and its compensation has not ended")]
    CompensationPending(JobId),
    /// [`reset_for_redrive`](super::FenceStore::reset_for_redrive) on a job that is not dead.
    #[error("job {job_id} is {status}, not dead")]
    NotDead {
        /// The job.
        job_id: JobId,
        /// Its status.
        status: JobStatus,
    },
    /// Pruning asked for a status that is not finished (`pending`, `running`):
    /// nothing deleted.
    #[error("{0} is not a finished status: only done, cancelled and dead rows are pruned")]
    NotFinished(JobStatus),
    /// A leader's write refused: the role's fence in PostgreSQL is not the
    /// leader's token (a newer leader claimed it, or this one never did).
    #[error("leader of {role}: fenced out, token {ours} (current fence {current:?})")]
    LeaderFencedOut {
        /// The elected role.
        role: String,
        /// Our token.
        ours: ObservedFence,
        /// The role's fence now (`None`: never claimed).
        current: Option<ObservedFence>,
    },
    /// A scheduler leader's ticks refused because their schedule is paused
    /// (SQLSTATE `TF021`, migration 0020): the pause committed after the
    /// leader looked at the schedule. Nothing of the transaction was written.
    #[error("schedule paused: {message}")]
    SchedulePaused {
        /// The database's message (names the schedule).
        message: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// The namespace records another way of owning jobs than the
    /// configuration asks for ([`Config::partitions`](crate::Config::partitions)):
    /// set the recorded one (or use a new namespace).
    #[error(
        "the namespace records {} but the configuration asks for {}: set partitions to the recorded value (TENURE_PARTITIONS) or use a new namespace",
        partitions_text(*recorded),
        partitions_text(*configured)
    )]
    PartitionsChanged {
        /// What the namespace records (`None`: one lock per job).
        recorded: Option<u32>,
        /// What the configuration says.
        configured: Option<u32>,
    },
    /// A partition owner's claim refused: the partition's fence in PostgreSQL
    /// is at or above the owner's token. Above: a newer owner claimed it (this
    /// one is stale). Equal: etcd issued this token before (its revisions went
    /// backwards): an alarm. Either way, run none of its jobs.
    #[error(
        "partition {partition} of {job_type}: fenced out, token {ours} (current fence {current})"
    )]
    PartitionFencedOut {
        /// The job type.
        job_type: String,
        /// The partition.
        partition: u32,
        /// Our token.
        ours: ObservedFence,
        /// The partition's fence now.
        current: ObservedFence,
    },
    /// A schema or table name that is not a plain identifier.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// `"schema"` or `"table"`.
        what: &'static str,
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A table the guard cannot protect: a partitioned table (a write straight
    /// into one of its partitions would bypass a statement-level trigger on the
    /// parent) or a partition (a write through the parent would bypass it).
    #[error("cannot guard {table}: {reason}")]
    Unguardable {
        /// The table.
        table: String,
        /// Why.
        reason: &'static str,
    },
    /// A row holds a value Tenure cannot represent (e.g. a negative counter written
    /// by hand).
    #[error("job {job_id}: corrupt row: {reason}")]
    Corrupt {
        /// The job.
        job_id: JobId,
        /// What is wrong.
        reason: String,
    },
    /// PostgreSQL refused us: TLS, the password or `pg_hba.conf`, or a privilege
    /// the role lacks (`postgresql 127.0.0.1:5432: authentication failed: ...`).
    #[error(transparent)]
    Access(#[from] crate::security::AccessError),
    /// A Tenure function refused its arguments (SQLSTATE
    /// [`ARGUMENT_REFUSED_SQLSTATE`], migration 0016): a prune age below the
    /// schema's `prune_floor` or a batch outside 1 to
    /// [`MAX_PRUNE_BATCH`](crate::config::MAX_PRUNE_BATCH), a worker report
    /// or a refusal record whose values cannot be true. Nothing was written.
    #[error("refused by the database: {message}")]
    ArgumentRefused {
        /// The function's message (it names the function and the bound).
        message: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A password would be sent without verified TLS to a PostgreSQL server
    /// that is not on loopback, and
    /// [`Config::allow_insecure_transport`](crate::Config::allow_insecure_transport)
    /// is not set: nothing was sent.
    #[error(transparent)]
    InsecureTransport(#[from] crate::security::InsecureTransport),
    /// A database error: I/O, timeout, contention, constraint. Not a fence verdict.
    #[error("database error: {0}")]
    Db(#[source] sqlx::Error),
    /// Applying the embedded migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
}

impl FenceError {
    /// Whether this error means "a newer generation owns the job, or the write came
    /// from no generation": [`FencedOut`](FenceError::FencedOut) or
    /// [`GuardRefused`](FenceError::GuardRefused). Such a worker must stop and must not
    /// ack; it is a stale rejection, never contention.
    ///
    /// ```
    /// use tenure::{blocks::fence::FenceError, JobId, ObservedFence};
    /// let e = FenceError::FencedOut {
    ///     job_id: JobId::from_key("t", "k"),
    ///     ours: ObservedFence::new(41).unwrap(),
    ///     current: ObservedFence::new(42),
    /// };
    /// assert!(e.is_fenced_out());
    /// assert!(!FenceError::NotFound(JobId::from_key("t", "k")).is_fenced_out());
    /// ```
    pub fn is_fenced_out(&self) -> bool {
        matches!(
            self,
            FenceError::FencedOut { .. } | FenceError::GuardRefused { .. }
        )
    }

    /// Whether this is the revision-regression alarm
    /// ([`TokenRegression`](FenceError::TokenRegression)): a fresh claim met its own
    /// token on the row. Not stale, not contention.
    pub fn is_token_regression(&self) -> bool {
        matches!(self, FenceError::TokenRegression { .. })
    }

    /// Classifies a database error: the guard's SQLSTATE becomes
    /// [`GuardRefused`](FenceError::GuardRefused), a TLS, authentication or
    /// privilege failure [`Access`](FenceError::Access), anything else
    /// [`Db`](FenceError::Db).
    /// Use it on errors of a step's own writes (made through
    /// [`FencedTx::conn`](super::FencedTx::conn)); `From<sqlx::Error>` does the same.
    pub fn from_sqlx(err: sqlx::Error) -> Self {
        let failure = classify(&err);
        let message = err
            .as_database_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        match failure {
            PgFailure::GuardRefused => FenceError::GuardRefused {
                message,
                source: err,
            },
            PgFailure::ArgumentRefused => FenceError::ArgumentRefused {
                message,
                source: err,
            },
            PgFailure::WallRefused => FenceError::ProtocolRefused {
                message,
                source: err,
            },
            PgFailure::SchedulePaused => FenceError::SchedulePaused {
                message,
                source: err,
            },
            PgFailure::Refused { step, detail } => FenceError::Access(refusal(step, detail)),
            PgFailure::CasRefused | PgFailure::Other => FenceError::Db(err),
        }
    }
}

impl From<sqlx::Error> for FenceError {
    fn from(err: sqlx::Error) -> Self {
        FenceError::from_sqlx(err)
    }
}

impl From<sqlx::migrate::MigrateError> for FenceError {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        FenceError::Migrate(err)
    }
}

/// How a [`FenceError::PartitionsChanged`] names a way of owning jobs.
fn partitions_text(p: Option<u32>) -> String {
    match p {
        Some(n) => format!("{n} partitions per job type"),
        None => "one etcd lock per job".into(),
    }
}

/// PostgreSQL's refusal of us, as [`classify`] read it (`PgFailure::Refused`); the address is filled in where it is known
/// (a connect).
fn refusal(step: AccessStep, detail: String) -> AccessError {
    AccessError {
        server: Server::Postgres,
        address: String::new(),
        step,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::fmt;

    use super::*;

    /// A database error as PostgreSQL would send it: a SQLSTATE and a message.
    #[derive(Debug)]
    struct Pg {
        code: &'static str,
        message: &'static str,
    }

    impl fmt::Display for Pg {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.message)
        }
    }

    impl std::error::Error for Pg {}

    impl sqlx::error::DatabaseError for Pg {
        fn message(&self) -> &str {
            self.message
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.code))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn pg(code: &'static str, message: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Pg { code, message }))
    }

    #[test]
    fn tenures_own_sqlstates_are_named() {
        let guard = pg(
            "TF001",
            "tenure guard: ledger written outside a fenced transaction",
        );
        assert_eq!(classify(&guard), PgFailure::GuardRefused);
        assert!(is_guard_refusal(&guard));
        assert!(matches!(
            FenceError::from(guard),
            FenceError::GuardRefused { message, .. } if message.starts_with("tenure guard")
        ));
        let cas = pg("TF002", "tenure_step_cas: no row");
        assert_eq!(classify(&cas), PgFailure::CasRefused);
        assert!(!is_guard_refusal(&cas));
        // Outside a step commit a CAS refusal is a plain database error.
        assert!(matches!(FenceError::from(cas), FenceError::Db(_)));
    }

    #[test]
    fn refusals_are_named() {
        assert!(matches!(
            classify(&pg(
                "28P01",
                "password authentication failed for user \"w\""
            )),
            PgFailure::Refused {
                step: AccessStep::Authenticate,
                ..
            }
        ));
        assert_eq!(
            classify(&pg(
                "28000",
                "no pg_hba.conf entry for host \"127.0.0.1\", user \"w\", database \"d\", no encryption"
            )),
            PgFailure::Refused {
                step: AccessStep::Tls,
                detail: "the server requires TLS (no pg_hba.conf entry for host \"127.0.0.1\", user \"w\", database \"d\", no encryption)".into()
            }
        );
        assert!(matches!(
            classify(&pg(
                "28000",
                "certificate authentication failed for user \"w\""
            )),
            PgFailure::Refused {
                step: AccessStep::Tls,
                ..
            }
        ));
        assert!(matches!(
            classify(&pg("28000", "role \"w\" is not permitted to log in")),
            PgFailure::Refused {
                step: AccessStep::Authenticate,
                ..
            }
        ));
        let denied = pg("42501", "permission denied for table jobs");
        assert_eq!(
            classify(&denied),
            PgFailure::Refused {
                step: AccessStep::Authorize,
                detail: "permission denied for table jobs".into()
            }
        );
        assert!(matches!(FenceError::from(denied), FenceError::Access(_)));
        let io = std::io::Error::other("received fatal alert: UnknownCA");
        assert_eq!(
            classify(&sqlx::Error::Io(io)),
            PgFailure::Refused {
                step: AccessStep::Tls,
                detail: "the server does not trust the client certificate".into()
            }
        );
        let tls = sqlx::Error::Tls("invalid peer certificate: UnknownIssuer".into());
        assert_eq!(
            classify(&tls),
            PgFailure::Refused {
                step: AccessStep::Tls,
                detail: "unknown CA".into()
            }
        );
        // A TLS error the markers do not know keeps its own words.
        let tls = sqlx::Error::Tls("handshake eof".into());
        assert_eq!(
            classify(&tls),
            PgFailure::Refused {
                step: AccessStep::Tls,
                detail: "handshake eof".into()
            }
        );
    }

    #[test]
    fn everything_else_is_a_database_error() {
        for err in [
            pg("23505", "duplicate key value violates unique constraint"),
            pg("40001", "could not serialize access"),
            pg("55P03", "canceling statement due to lock timeout"),
            sqlx::Error::Io(std::io::Error::other("connection reset by peer")),
            sqlx::Error::RowNotFound,
            sqlx::Error::PoolTimedOut,
        ] {
            assert_eq!(classify(&err), PgFailure::Other, "{err:?}");
            assert!(matches!(FenceError::from(err), FenceError::Db(_)));
        }
    }
}

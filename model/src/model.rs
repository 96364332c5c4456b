//! The protocol as a Stateright [`Model`]: state, actions, properties.
//!
//! Every action is one atomic step of one real component, named after the
//! function in `framework/src` it stands for (the comment on each
//! [`Action`] variant gives the file and function). Anything a real component
//! does between two actions is invisible to the others, so the interleavings of
//! actions are all the orders in which the real calls can land; a worker that
//! "pauses at any point for any time" is a worker whose next action is
//! scheduled later, with the faults a long pause causes (its lease expires, its
//! open PostgreSQL transaction is ended) available as actions of their own.

use std::fmt;

use stateright::{Model, Property};

/// Largest number of workers a [`Bound`] may ask for.
pub const MAX_WORKERS: usize = 3;
/// Largest number of jobs a [`Bound`] may ask for.
pub const MAX_JOBS: usize = 2;
/// Largest number of steps per job a [`Bound`] may ask for.
pub const MAX_STEPS: usize = 3;
/// Largest number of partitions a [`Mode::Partitions`] may ask for.
pub const MAX_PARTITIONS: usize = 2;

/// How jobs are owned (`Config::partitions`, `runtime/owning.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One etcd lock per job (`Owning::Locks`, the default).
    Locks,
    /// Partition mode (`Owning::Partitions`) with this many partitions
    /// (1..=[`MAX_PARTITIONS`]); job `j` is in partition `j % P`.
    Partitions(u8),
}

/// Which version of the protocol the model runs: the faithful one, or one with a
/// check switched off. Each weakened switch has a test that finds a
/// counterexample for it (`tests/protocol.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Switches {
    /// The claim's `fence < $tok` (`fence/sql.rs`, `claim_sql`). Off: weakening (a).
    pub claim_fence: bool,
    /// `fence = $tok` in the step admission `SELECT .. FOR UPDATE`
    /// (`fence/sql.rs`, `Sql::new`, `admit`). Off together with
    /// [`Switches::cas_fence`]: weakening (b).
    pub admission_fence: bool,
    /// `fence = p_fence` in the step CAS (`migrations/0003_step_cas.sql`,
    /// `tenure_step_cas`). It repeats the admission's check under the same row
    /// lock, so dropping only the admission's check is caught here.
    pub cas_fence: bool,
    /// The linearizable re-read after a lock create (`lease/batch.rs`,
    /// `Session::finish`). Off: weakening (c).
    pub verify_read: bool,
    /// What a claim on a fresh lock does when the row's fence EQUALS its token.
    pub equal_token: EqualToken,
    /// A refused claim releases its fresh lock (`JobRun::claim_refused` in
    /// `runtime/job_actor.rs` ends as `Outcome::Stale` or `Regression`, which
    /// `settle` performs with `ReleaseMode::Prompt`). Off: a
    /// liveness mutation, the negative control of [`crate::liveness`].
    pub release_refused_lock: bool,
    /// Partition mode: how the owner's claim of the partition's row in
    /// `partition_fences` (`tenure_claim_partition`, migration 0015) checks
    /// the fence there.
    pub partition_fence: PartitionFence,
    /// Partition mode: the job claim accepts the row's own token
    /// (`tenure_claim(.., p_partitioned = true, ..)`: `fence < $tok OR fence =
    /// $tok`). Off: the strict per-job claim, a liveness mutation (an owner
    /// cannot take back a job it handed back).
    pub partition_claim_equal: bool,
}

/// How the partition owner's claim in `partition_fences` is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PartitionFence {
    /// The code: `ON CONFLICT .. DO UPDATE .. WHERE f.fence < EXCLUDED.fence`,
    /// refused otherwise (`FenceError::PartitionFencedOut`; the regression
    /// alarm when the fence equals the token), and the key resigned.
    Strict,
    /// `WHERE f.fence <= EXCLUDED.fence`: a token equal to the fence accepted.
    AcceptEqual,
    /// No partition claim: the owner runs jobs right after its election.
    Skip,
}

/// The claim's answer when `fence == token` on a freshly acquired lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EqualToken {
    /// The fixed protocol (design card amendment, issue 15): a claim on a fresh
    /// lock must strictly raise the fence; `fence == token` is an alarm and the
    /// job is handed back (lock released, message not acked).
    Alarm,
    /// What the code does today: `FenceStore::claim` finds zero rows, then
    /// `claim_refused` sees `fence == token` on a live, unreleased row and
    /// answers `ClaimVerdict::Ours` (`fence/claims.rs`), so the acquisition runs the
    /// job as if it had raised the fence itself. Weakening (d).
    AcceptAsOurs,
    /// Issue 15 done only in `claim_refused`: `fence == token` at the claim is
    /// an alarm, but a claim whose transaction the server ended still goes on
    /// to admit its step (`end_untaken`, formerly `end_unused_later`: "the step's first fenced call
    /// will tell"), and that admission matches a row whose fence another
    /// acquisition raised to the same token.
    AlarmAtClaimOnly,
}

impl Switches {
    /// The protocol as the design card states it, with issue 15's strict claim.
    pub const FAITHFUL: Switches = Switches {
        claim_fence: true,
        admission_fence: true,
        cas_fence: true,
        verify_read: true,
        equal_token: EqualToken::Alarm,
        release_refused_lock: true,
        partition_fence: PartitionFence::Strict,
        partition_claim_equal: true,
    };
}

/// How far the model reaches: sizes and fault budgets. Each budget counts how
/// many times the fault may happen in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bound {
    /// Workers (1..=[`MAX_WORKERS`]).
    pub workers: usize,
    /// Jobs (1..=[`MAX_JOBS`]).
    pub jobs: usize,
    /// Steps per job (1..=[`MAX_STEPS`]).
    pub steps: u8,
    /// etcd lease expiries (a worker paused or partitioned past its TTL).
    pub lease_expiries: u8,
    /// Open PostgreSQL transactions ended under a paused worker
    /// (`idle_in_transaction_session_timeout`).
    pub pg_aborts: u8,
    /// etcd snapshot restores without `--bump-revision`.
    pub snapshot_restores: u8,
    /// Lock creates answered successfully on an already expired lease (etcd
    /// issue 11456).
    pub phantom_grants: u8,
    /// The job type's `max_takeovers`.
    pub max_takeovers: u8,
    /// How jobs are owned.
    pub mode: Mode,
    /// Partition mode: hand-overs a rebalance may start (an owner above its
    /// fair share giving a partition back).
    pub handovers: u8,
}

impl Bound {
    /// The bound `make test` checks (see the crate docs for its size).
    pub const SMALL: Bound = Bound {
        workers: 2,
        jobs: 2,
        steps: 2,
        lease_expiries: 1,
        pg_aborts: 1,
        snapshot_restores: 1,
        phantom_grants: 1,
        max_takeovers: 1,
        mode: Mode::Locks,
        handovers: 0,
    };

    /// A larger bound (the ignored test): three steps, two lease expiries.
    /// 28,045,658 states, exhaustive in about 150 s (release); see README.md.
    pub const LARGER: Bound = Bound {
        workers: 2,
        jobs: 2,
        steps: 3,
        lease_expiries: 2,
        pg_aborts: 1,
        snapshot_restores: 1,
        phantom_grants: 1,
        max_takeovers: 1,
        mode: Mode::Locks,
        handovers: 0,
    };

    /// Partition mode as `make test` checks it, part one: the two jobs in one
    /// partition (one owner runs both under one token), one hand-over, one
    /// lease expiry, one transaction ended by the server; no snapshot restore
    /// and no issue 11456 grant (see README.md for its size).
    pub const PARTITIONS: Bound = Bound {
        mode: Mode::Partitions(1),
        handovers: 1,
        snapshot_restores: 0,
        phantom_grants: 0,
        ..Bound::SMALL
    };

    /// Partition mode, part two: a snapshot restore instead of the lease
    /// expiry (what the strict raise of `partition_fences` is for).
    pub const PARTITIONS_RESTORE: Bound = Bound {
        lease_expiries: 0,
        snapshot_restores: 1,
        ..Bound::PARTITIONS
    };

    /// Partition mode with every fault of [`Bound::SMALL`] but the issue 11456
    /// grant, and one hand-over (the ignored test; about 22 million states).
    pub const PARTITIONS_LARGER: Bound = Bound {
        snapshot_restores: 1,
        ..Bound::PARTITIONS
    };
}

/// The model: a bound and the protocol's switches.
#[derive(Clone, Debug)]
pub struct Tenure {
    /// Sizes and fault budgets.
    pub bound: Bound,
    /// Which checks the protocol makes.
    pub switches: Switches,
}

impl Tenure {
    /// The faithful protocol within `bound`.
    pub fn faithful(bound: Bound) -> Self {
        Tenure {
            bound,
            switches: Switches::FAITHFUL,
        }
    }
}

// ---------------------------------------------------------------- state

/// The whole system: etcd, PostgreSQL, NATS, the workers, the fault budgets
/// left, and history variables the properties read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The coordinator.
    pub etcd: Etcd,
    /// The job rows.
    pub pg: [Row; MAX_JOBS],
    /// Per job: its message is still in the work stream (not acked).
    pub nats: [bool; MAX_JOBS],
    /// Each worker's one job actor (`max_in_flight = 1`).
    pub workers: [Pc; MAX_WORKERS],
    /// Partition mode: per partition, its row in `partition_fences` (0: none).
    pub partition_fences: [u8; MAX_PARTITIONS],
    /// Partition mode: per worker and partition, what its rebalancer holds
    /// (`runtime/partitions.rs`, `Ownership`).
    pub owns: [[Own; MAX_PARTITIONS]; MAX_WORKERS],
    /// Faults that may still happen.
    pub budget: Budget,
    /// History variables (not part of any real system).
    pub ghost: Ghost,
}

/// etcd as one linearizable store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Etcd {
    /// The revision of the last lock create (a create takes `revision + 1`).
    /// Other writes also raise etcd's revision; only the order of creates
    /// matters to the tokens, so they are left out.
    pub revision: u8,
    /// Per worker: its current session lease.
    pub leases: [Lease; MAX_WORKERS],
    /// Per job: its lock key, if it exists.
    pub locks: [Option<LockKey>; MAX_JOBS],
    /// Partition mode: per partition, its key `<ns>/own/partitions/<type>/<p>`.
    pub partitions: [Option<LockKey>; MAX_PARTITIONS],
}

/// A worker's session lease: the `epoch`-th lease that worker was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// How many leases the worker held before this one.
    pub epoch: u8,
    /// Not expired.
    pub alive: bool,
}

/// A job lock key: who holds it (worker, lease epoch) and its `create_revision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    /// The holder.
    pub worker: u8,
    /// The holder's lease.
    pub epoch: u8,
    /// The fencing token.
    pub create_revision: u8,
}

/// A job row (`framework/migrations/0001_jobs.sql`). Fields hold the newest
/// version, committed or not; an uncommitted claim keeps what it overwrote in
/// its [`Tx::Open`] so a rollback restores it, and only the row lock's holder
/// can have uncommitted changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// The largest token the row accepted.
    pub fence: u8,
    /// The next step to run.
    pub step: u8,
    /// `pending`/`running` are one [`Status::Live`] here.
    pub status: Status,
    /// Claims that raised a fence whose owner did not release.
    pub takeovers: u8,
    /// The owner released the job (`tenure_release`; only partition mode's
    /// hand-over writes it here).
    pub released: bool,
    /// The worker whose open transaction holds the row lock.
    pub locked_by: Option<u8>,
}

/// A row's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// `pending` or `running`.
    Live,
    /// `done`.
    Done,
    /// `dead`.
    Dead,
}

impl Status {
    pub(crate) fn is_terminal(self) -> bool {
        !matches!(self, Status::Live)
    }
}

/// What a lock create handed a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The job (in an [`Own`], the partition).
    pub job: u8,
    /// The lease epoch the create used.
    pub epoch: u8,
    /// The create's revision: the token.
    pub token: u8,
    /// History: the key really was stored (false for an etcd issue 11456 grant).
    pub real: bool,
}

/// An open PostgreSQL transaction of a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tx {
    /// None open.
    None,
    /// Open and holding the row lock; `undo` is `Some` when it carries an
    /// uncommitted claim (`FenceStore::claim_and_begin`).
    Open {
        /// What the claim overwrote.
        undo: Option<Undo>,
    },
    /// Ended by the server (rolled back); the worker does not know yet.
    /// `claim`: it carried the worker's claim, which is undone too.
    Aborted {
        /// The transaction carried an uncommitted claim.
        claim: bool,
    },
}

/// Row fields an uncommitted claim overwrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Undo {
    /// The fence before the claim.
    pub fence: u8,
    /// The takeover count before the claim.
    pub takeovers: u8,
    /// The released flag before the claim (a released row is `pending`; the
    /// claim makes it `running` and not released).
    pub released: bool,
}

/// Where a worker's job actor is in its phases (`JobRun::phases`,
/// `runtime/job_actor.rs` and `runtime/steps.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pc {
    /// No delivery.
    Idle,
    /// A delivery whose row was live at admission; next: acquire.
    Admitted {
        /// The job.
        job: u8,
    },
    /// The lock create answered; next: the verification re-read.
    Created(Grant),
    /// A verified grant; next: claim.
    Locked(Grant),
    /// Claimed; running step `step`.
    Running {
        /// The lock grant and token.
        grant: Grant,
        /// The step to commit next.
        step: u8,
        /// The step's transaction.
        tx: Tx,
        /// The claim found `takeovers > max_takeovers`: dead-letter instead.
        poisoned: bool,
    },
    /// Finishing: ack the message (if `ack`), then delete the lock (if any).
    Leaving {
        /// The job.
        job: u8,
        /// The lock to delete (guarded by its token).
        lock: Option<Grant>,
        /// The message still has to be acked.
        ack: bool,
    },
}

impl Pc {
    /// The job and token of a worker past its claim.
    /// (A worker whose transaction the server ended can only fail, unless it
    /// goes on to admit a step, when it counts again.)
    pub(crate) fn owner_of(&self) -> Option<(u8, u8, bool)> {
        match self {
            Pc::Running { grant, tx, .. } if !matches!(tx, Tx::Aborted { .. }) => {
                Some((grant.job, grant.token, grant.real))
            }
            _ => None,
        }
    }
}

/// Faults that may still happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    /// See [`Bound::lease_expiries`].
    pub lease_expiries: u8,
    /// See [`Bound::pg_aborts`].
    pub pg_aborts: u8,
    /// See [`Bound::snapshot_restores`].
    pub snapshot_restores: u8,
    /// See [`Bound::phantom_grants`].
    pub phantom_grants: u8,
    /// See [`Bound::handovers`].
    pub handovers: u8,
}

/// What a worker's rebalancer holds of one partition (`runtime/partitions.rs`:
/// `Rebalance::take`, then a `Unit` in `Ownership` until it is forgotten or
/// handed over).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Own {
    /// Nothing.
    None,
    /// The campaign's create answered; next: the re-read (`campaign_at`,
    /// `verify_leader`).
    Created(Grant),
    /// Elected (verified); next: the claim in `partition_fences`.
    Elected(Grant),
    /// Owned: its jobs are granted this token (`Ownership::grant`) until
    /// `handover` (cancelled by a hand-over or when found lost).
    Owned {
        /// The partition key's lease epoch and `create_revision`; `job` is the
        /// partition.
        grant: Grant,
        /// The unit's `handover` token is cancelled: no new grant, running
        /// jobs stop at their next step boundary.
        handover: bool,
    },
}

/// History variables: what the properties need to remember.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Per job and step: how many times a commit of that step committed (max 2).
    pub commits: [[u8; MAX_STEPS]; MAX_JOBS],
    /// Per job: the largest token of a committed claim.
    pub claimed: [u8; MAX_JOBS],
    /// Per job: the largest token any committed write of the row carried.
    pub accepted: [u8; MAX_JOBS],
    /// A step committed under a token smaller than a committed claim's.
    pub stale_commit: bool,
    /// A committed write carried a token smaller than an earlier one.
    pub token_decreased: bool,
    /// Per job: a release (partition hand-over) committed.
    pub released: [bool; MAX_JOBS],
}

// -------------------------------------------------------------- actions

/// One atomic step of one component. `w` is a worker index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `runtime/fetcher.rs` (the `Fetcher` pulling a message) with the
    /// admission read `FenceStore::jobs` (`fence/reads.rs`), then
    /// `JobRun::admit` (`runtime/job_actor.rs`): a terminal row is
    /// acked at once. NATS delivers an unacked message to any idle worker at
    /// any time (at-least-once, including while another worker still has it).
    Fetch {
        /// Worker.
        w: u8,
        /// Job.
        job: u8,
    },
    /// `Session::write_batch` (`lease/batch.rs`): the create-if-absent Txn
    /// under the worker's session lease. Held: `retry_later` (nak). Expired
    /// lease: etcd refuses the create, unless `phantom` (etcd issue 11456: the
    /// create is answered with a revision although the lease is gone, and no key
    /// stays).
    Acquire {
        /// Worker.
        w: u8,
        /// The answer is an issue 11456 phantom grant.
        phantom: bool,
    },
    /// `Session::finish` (`lease/batch.rs`): the linearizable re-read; the key
    /// must carry our lease and the create's revision, else
    /// `LockLostBeforeVerify` (undo, nak).
    VerifyGrant {
        /// Worker.
        w: u8,
    },
    /// `FenceStore::claim_and_begin` (`fence/claims.rs`; SQL `claim_sql` in
    /// `fence/sql.rs`): waits for the row lock, then `UPDATE .. WHERE fence <
    /// $tok` in a transaction that stays open for the first step. Zero rows:
    /// `claim_refused` (`fence/claims.rs`), then `JobRun::claim_refused`
    /// (`runtime/job_actor.rs`): the lock released (alarm) without acking.
    ClaimAndBegin {
        /// Worker.
        w: u8,
    },
    /// `end_untaken` (`runtime/steps.rs`, the `Offer` of `runtime/handover.rs`
    /// expiring): the step did not take the
    /// transaction in time; a claim's is committed alone
    /// (`FencedTx::commit_claim`, `fence/tx.rs`), an admission's rolled back.
    /// Also the poison path's `commit_claim` before `mark_dead`.
    EndUnusedTx {
        /// Worker.
        w: u8,
    },
    /// `FenceStore::begin_step` (`fence/claims.rs`): waits for the row lock,
    /// `SELECT .. WHERE fence = $tok AND step = $k .. FOR UPDATE`.
    BeginStep {
        /// Worker.
        w: u8,
    },
    /// `FencedTx::commit_step` / `commit_step_and_begin` (`fence/tx.rs`): the
    /// step CAS (`tenure_step_cas`, `migrations/0003_step_cas.sql`) and
    /// `COMMIT`, and for a step that is not the last the next step's
    /// admission in the same round trip.
    CommitStep {
        /// Worker.
        w: u8,
    },
    /// `FenceStore::mark_dead` (`fence/bookkeeping.rs`) from
    /// `JobRun::mark_dead` (`runtime/outcome.rs`): the poison check
    /// found `takeovers > max_takeovers`.
    MarkDead {
        /// Worker.
        w: u8,
    },
    /// `ack` (`runtime/job_actor.rs`; `Delivery::ack`, `queue/delivery.rs`),
    /// or the DLQ publish that terminates the message.
    Ack {
        /// Worker.
        w: u8,
    },
    /// `LockService::release` (`lease/service.rs`) through
    /// `Session::release_slice` (`lease/batch.rs`): a delete guarded by the
    /// key's `create_revision`.
    ReleaseLock {
        /// Worker.
        w: u8,
    },
    /// etcd: worker `w`'s lease expires (it was paused or partitioned past its
    /// TTL); etcd deletes its keys.
    LeaseExpires {
        /// Worker.
        w: u8,
    },
    /// `Session::establish_with_backoff` (`lease/session.rs`), run by the lease
    /// keeper after `Lost`: a new session lease. The job actor keeps its token.
    EstablishSession {
        /// Worker.
        w: u8,
    },
    /// PostgreSQL's `idle_in_transaction_session_timeout` ends worker `w`'s open
    /// transaction while it is paused: rolled back, row lock freed.
    PgEndsIdleTx {
        /// Worker.
        w: u8,
    },
    /// Partition mode, `Rebalance::take` -> `Session::own_partition`
    /// (`lease/partition.rs`) -> `campaign_at` (`lease/leader.rs`): the
    /// partition key created if absent under the worker's session lease.
    /// `phantom`: etcd issue 11456, as for [`Action::Acquire`].
    Campaign {
        /// Worker.
        w: u8,
        /// Partition.
        p: u8,
        /// The answer is an issue 11456 phantom grant.
        phantom: bool,
    },
    /// Partition mode, `verify_leader` (`lease/leader.rs`): the linearizable
    /// re-read; the key must carry our lease and the create's revision, else
    /// `Campaign::Follower`.
    VerifyCampaign {
        /// Worker.
        w: u8,
        /// Partition.
        p: u8,
    },
    /// Partition mode, `FenceStore::claim_partition` (`fence/partitions.rs`;
    /// `tenure_claim_partition`, migration 0015): raises the partition's row
    /// in `partition_fences` strictly, then `Ownership::insert`. Refused:
    /// `Rebalance::refused` (the regression alarm when the fence equals the
    /// token) and `resign_until_gone` (the key deleted, guarded by its
    /// `create_revision`).
    ClaimPartition {
        /// Worker.
        w: u8,
        /// Partition.
        p: u8,
    },
    /// Partition mode, `Rebalance::hand_over` -> `Ownership::start_handover`:
    /// a worker above its fair share gives a partition back; no new job of
    /// it is granted, running ones stop at their next step boundary.
    HandOver {
        /// Worker.
        w: u8,
        /// Partition.
        p: u8,
    },
    /// Partition mode, the hand-over's `resign_until_gone` (`Session::resign`:
    /// delete guarded by `create_revision`) and `Ownership::remove`. The code
    /// waits for the partition's in-flight jobs first, but at most
    /// `Config::shutdown_grace`; the model lets the delete come at any time.
    Resign {
        /// Worker.
        w: u8,
        /// Partition.
        p: u8,
    },
    /// Partition mode, `Ownership::forget_lost` (`Rebalance::reconcile` /
    /// `run`): the rebalancer sees its session lost or its key gone, cancels
    /// the unit's `handover` token and forgets it.
    ForgetPartition {
        /// Worker.
        w: u8,
        /// Partition.
        p: u8,
    },
    /// Partition mode, `run_steps` (`runtime/steps.rs`) finding
    /// `owned.handing_over()` at a step boundary: `Outcome::Release` ->
    /// `record_release` -> `FenceStore::record_release` (`tenure_release`:
    /// `released = true, status = 'pending' WHERE fence = $tok AND status =
    /// 'running' AND NOT released`), then the nak.
    ReleaseJob {
        /// Worker.
        w: u8,
    },
    /// etcd restored from a snapshot taken just before the last lock create,
    /// WITHOUT `--bump-revision`: the revision goes back by one and keys created
    /// after the snapshot are gone, so the next create reissues a token.
    EtcdRestoreWithoutBump,
}

impl Action {
    /// The function in `framework/src` this action stands for, and the worker
    /// that takes it (`None` for a server-side fault).
    pub fn function(&self) -> (&'static str, Option<u8>) {
        match *self {
            Action::Fetch { w, .. } => ("Fetcher fetch + FenceStore::jobs (admit)", Some(w)),
            Action::Acquire { w, phantom: false } => ("Session::acquire (write_batch)", Some(w)),
            Action::Acquire { w, phantom: true } => {
                ("Session::acquire (write_batch), etcd issue 11456", Some(w))
            }
            Action::VerifyGrant { w } => ("Session::finish (linearizable re-read)", Some(w)),
            Action::ClaimAndBegin { w } => ("FenceStore::claim_and_begin", Some(w)),
            Action::EndUnusedTx { w } => ("end_untaken / FencedTx::commit_claim", Some(w)),
            Action::BeginStep { w } => ("FenceStore::begin_step", Some(w)),
            Action::CommitStep { w } => ("FencedTx::commit_step(_and_begin)", Some(w)),
            Action::MarkDead { w } => ("FenceStore::mark_dead", Some(w)),
            Action::Ack { w } => ("ack", Some(w)),
            Action::ReleaseLock { w } => ("LockService::release (guarded delete)", Some(w)),
            Action::LeaseExpires { w } => ("etcd: lease expires", Some(w)),
            Action::EstablishSession { w } => ("Session::establish_with_backoff", Some(w)),
            Action::PgEndsIdleTx { w } => ("postgres: idle_in_transaction timeout", Some(w)),
            Action::Campaign { w, phantom, .. } => (
                if phantom {
                    "Session::own_partition (campaign_at), etcd issue 11456"
                } else {
                    "Session::own_partition (campaign_at)"
                },
                Some(w),
            ),
            Action::VerifyCampaign { w, .. } => ("verify_leader (linearizable re-read)", Some(w)),
            Action::ClaimPartition { w, .. } => ("FenceStore::claim_partition", Some(w)),
            Action::HandOver { w, .. } => ("Rebalance::hand_over", Some(w)),
            Action::Resign { w, .. } => ("resign_until_gone (guarded delete)", Some(w)),
            Action::ForgetPartition { w, .. } => ("Ownership::forget_lost", Some(w)),
            Action::ReleaseJob { w } => ("handing_over: FenceStore::record_release", Some(w)),
            Action::EtcdRestoreWithoutBump => {
                ("etcd: snapshot restore without --bump-revision", None)
            }
        }
    }
}

/// Job names in traces.
pub fn job_name(job: u8) -> char {
    char::from(b'A' + job)
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, w) = self.function();
        match w {
            Some(w) => write!(f, "w{w} {name}"),
            None => f.write_str(name),
        }
    }
}

// ---------------------------------------------------------------- model

pub(crate) fn idx(n: u8) -> usize {
    usize::from(n)
}

/// A committed write of job `job`'s row under `token`: history for the
/// properties. `claim`: the write is a claim; `step`: it commits that step.
pub(crate) fn record_commit(g: &mut Ghost, job: u8, token: u8, claim: bool, step: Option<u8>) {
    let j = idx(job);
    if token < g.accepted[j] {
        g.token_decreased = true;
    }
    g.accepted[j] = g.accepted[j].max(token);
    if claim {
        g.claimed[j] = g.claimed[j].max(token);
    }
    if let Some(k) = step {
        if token < g.claimed[j] {
            g.stale_commit = true;
        }
        let c = &mut g.commits[j][idx(k)];
        *c = (*c + 1).min(2);
    }
}

impl Tenure {
    pub(crate) fn workers(&self) -> impl Iterator<Item = u8> + use<> {
        (0..self.bound.workers.min(MAX_WORKERS)).filter_map(|w| u8::try_from(w).ok())
    }

    pub(crate) fn jobs(&self) -> impl Iterator<Item = u8> + use<> {
        (0..self.bound.jobs.min(MAX_JOBS)).filter_map(|j| u8::try_from(j).ok())
    }

    /// The admission predicate (`fence/sql.rs`, `admit`).
    fn admits(&self, row: &Row, token: u8, step: u8) -> bool {
        (row.fence == token || !self.switches.admission_fence)
            && row.step == step
            && row.status == Status::Live
            && !row.released
    }

    /// The step CAS predicate (`tenure_step_cas`).
    fn cas_matches(&self, row: &Row, token: u8, step: u8) -> bool {
        (row.fence == token || !self.switches.cas_fence)
            && row.step == step
            && row.status == Status::Live
            && !row.released
    }

    /// After a refused fenced statement (`verdict`, `fence/claims.rs`): a newer
    /// token means `FencedOut`, which `JobActor::stale` handles by stopping
    /// without ack and leaving the lock alone; anything else fails the attempt
    /// and hands the job back (`fail_attempt` / `hand_back`: lock released,
    /// message nak'ed).
    fn after_refusal(&self, row: &Row, grant: Grant) -> Pc {
        if row.fence > grant.token {
            Pc::Idle
        } else {
            self.leaving(grant, false)
        }
    }

    /// Where a worker goes to end a delivery: ack (if `ack`), then delete the
    /// job's lock. Partition mode has no lock to delete: a hand-back is the
    /// nak alone (the worker is idle again).
    pub(crate) fn leaving(&self, grant: Grant, ack: bool) -> Pc {
        let lock = (!self.partitioned()).then_some(grant);
        if ack || lock.is_some() {
            Pc::Leaving {
                job: grant.job,
                lock,
                ack,
            }
        } else {
            Pc::Idle
        }
    }

    fn step_to(&self, s: &mut State, w: u8, action: Action) -> Option<()> {
        let wi = idx(w);
        let pc = s.workers[wi];
        match action {
            Action::Fetch { job, .. } => {
                let j = idx(job);
                if pc != Pc::Idle || !s.nats[j] {
                    return None;
                }
                // Partition mode: fetched from the consumer of an owned
                // partition, granted its token (`acquire_partition`).
                let grant = if self.partitioned() {
                    Some(self.partition_grant(s, w, job)?)
                } else {
                    None
                };
                if s.pg[j].status.is_terminal() {
                    s.nats[j] = false; // ack (or the DLQ publish) at once
                } else if let Some(g) = grant {
                    s.workers[wi] = Pc::Locked(g);
                } else {
                    s.workers[wi] = Pc::Admitted { job };
                }
            }
            Action::Acquire { phantom, .. } => {
                let Pc::Admitted { job } = pc else {
                    return None;
                };
                let j = idx(job);
                let lease = s.etcd.leases[wi];
                if phantom {
                    if lease.alive || s.budget.phantom_grants == 0 || s.etcd.locks[j].is_some() {
                        return None;
                    }
                    s.budget.phantom_grants -= 1;
                    s.etcd.revision += 1;
                    let grant = Grant {
                        job,
                        epoch: lease.epoch,
                        token: s.etcd.revision,
                        real: false,
                    };
                    s.workers[wi] = self.created(grant);
                } else if s.etcd.locks[j].is_some() || !lease.alive {
                    // Contended, or etcd refused the dead lease: retry_later.
                    s.workers[wi] = Pc::Idle;
                } else {
                    s.etcd.revision += 1;
                    s.etcd.locks[j] = Some(LockKey {
                        worker: w,
                        epoch: lease.epoch,
                        create_revision: s.etcd.revision,
                    });
                    let grant = Grant {
                        job,
                        epoch: lease.epoch,
                        token: s.etcd.revision,
                        real: true,
                    };
                    s.workers[wi] = self.created(grant);
                }
            }
            Action::VerifyGrant { .. } => {
                let Pc::Created(g) = pc else { return None };
                let ours = LockKey {
                    worker: w,
                    epoch: g.epoch,
                    create_revision: g.token,
                };
                s.workers[wi] = if s.etcd.locks[idx(g.job)] == Some(ours) {
                    Pc::Locked(g)
                } else {
                    Pc::Idle // LockLostBeforeVerify: undo (nothing of ours left), nak
                };
            }
            Action::ClaimAndBegin { .. } if self.partitioned() => {
                let Pc::Locked(g) = pc else { return None };
                self.claim_partitioned(s, w, g)?;
            }
            Action::ClaimAndBegin { .. } => {
                let Pc::Locked(g) = pc else { return None };
                let j = idx(g.job);
                let row = s.pg[j];
                if row.locked_by.is_some() {
                    return None; // the UPDATE waits for the row lock
                }
                if row.status.is_terminal() {
                    // FenceError::Terminal: ack, release the lock.
                    s.workers[wi] = self.leaving(g, true);
                } else if row.fence < g.token || !self.switches.claim_fence {
                    let undo = Undo {
                        fence: row.fence,
                        takeovers: row.takeovers,
                        released: row.released,
                    };
                    let r = &mut s.pg[j];
                    r.takeovers = (r.takeovers + u8::from(r.fence > 0)).min(9);
                    r.fence = g.token;
                    r.locked_by = Some(w);
                    s.workers[wi] = Pc::Running {
                        grant: g,
                        step: r.step,
                        tx: Tx::Open { undo: Some(undo) },
                        poisoned: r.takeovers > self.bound.max_takeovers,
                    };
                } else if row.fence == g.token
                    && self.switches.equal_token == EqualToken::AcceptAsOurs
                {
                    // claim_refused -> ClaimVerdict::Ours -> claim_current; then
                    // claim_and_begin admits the step with begin_step.
                    s.workers[wi] = Pc::Running {
                        grant: g,
                        step: row.step,
                        tx: Tx::None,
                        poisoned: row.takeovers > self.bound.max_takeovers,
                    };
                } else {
                    // FencedOut (or, fixed protocol, fence == token on a fresh
                    // lock): ALERT, release the lock, do not ack.
                    s.workers[wi] = if self.switches.release_refused_lock {
                        self.leaving(g, false)
                    } else {
                        Pc::Idle
                    };
                }
            }
            Action::EndUnusedTx { .. } => {
                let Pc::Running {
                    grant,
                    step,
                    tx,
                    poisoned,
                } = pc
                else {
                    return None;
                };
                let undo = match tx {
                    Tx::Open { undo } => undo,
                    Tx::None => return None,
                    Tx::Aborted { claim } => {
                        // The commit (of a claim) or rollback fails. Today:
                        // "committing the claim alone failed; the step's first
                        // fenced call will tell" (end_unused_later then), so the step
                        // goes on to begin_step. Fixed protocol: a generation
                        // whose claim did not commit never admits a step; it
                        // hands the job back.
                        s.workers[wi] = if claim
                            && self.switches.equal_token != EqualToken::AlarmAtClaimOnly
                            && self.switches.equal_token != EqualToken::AcceptAsOurs
                        {
                            self.leaving(grant, false)
                        } else {
                            Pc::Running {
                                grant,
                                step,
                                tx: Tx::None,
                                poisoned,
                            }
                        };
                        return Some(());
                    }
                };
                let j = idx(grant.job);
                if undo.is_some() {
                    record_commit(&mut s.ghost, grant.job, grant.token, true, None);
                }
                s.pg[j].locked_by = None;
                s.workers[wi] = Pc::Running {
                    grant,
                    step,
                    tx: Tx::None,
                    poisoned,
                };
            }
            Action::BeginStep { .. } => {
                let Pc::Running {
                    grant,
                    step,
                    tx: Tx::None,
                    poisoned: false,
                } = pc
                else {
                    return None;
                };
                let j = idx(grant.job);
                let row = s.pg[j];
                if row.locked_by.is_some() {
                    return None; // FOR UPDATE waits
                }
                if self.admits(&row, grant.token, step) {
                    s.pg[j].locked_by = Some(w);
                    s.workers[wi] = Pc::Running {
                        grant,
                        step,
                        tx: Tx::Open { undo: None },
                        poisoned: false,
                    };
                } else {
                    s.workers[wi] = self.after_refusal(&row, grant);
                }
            }
            Action::CommitStep { .. } => {
                let Pc::Running {
                    grant,
                    step,
                    tx,
                    poisoned: false,
                } = pc
                else {
                    return None;
                };
                let j = idx(grant.job);
                let undo = match tx {
                    Tx::Open { undo } => undo,
                    Tx::None => return None,
                    Tx::Aborted { .. } => {
                        // The server ended the transaction: the commit fails,
                        // fail_attempt hands the job back.
                        s.workers[wi] = self.leaving(grant, false);
                        return Some(());
                    }
                };
                let row = s.pg[j];
                if !self.cas_matches(&row, grant.token, step) {
                    // TF002: nothing commits; the claim (if any) rolls back.
                    let r = &mut s.pg[j];
                    if let Some(u) = undo {
                        r.fence = u.fence;
                        r.takeovers = u.takeovers;
                        r.released = u.released;
                    }
                    r.locked_by = None;
                    s.workers[wi] = self.after_refusal(r, grant);
                    return Some(());
                }
                let last = step + 1 >= self.bound.steps;
                let r = &mut s.pg[j];
                r.step = step + 1;
                if last {
                    r.status = Status::Done;
                }
                r.locked_by = None;
                record_commit(
                    &mut s.ghost,
                    grant.job,
                    grant.token,
                    undo.is_some(),
                    Some(step),
                );
                if last {
                    s.workers[wi] = self.leaving(grant, true);
                } else {
                    // Same round trip: BEGIN and the next step's admission.
                    let next = step + 1;
                    let admitted = self.admits(&s.pg[j], grant.token, next);
                    if admitted {
                        s.pg[j].locked_by = Some(w);
                    }
                    s.workers[wi] = Pc::Running {
                        grant,
                        step: next,
                        tx: if admitted {
                            Tx::Open { undo: None }
                        } else {
                            Tx::None
                        },
                        poisoned: false,
                    };
                }
            }
            Action::MarkDead { .. } => {
                let Pc::Running {
                    grant,
                    tx,
                    poisoned: true,
                    ..
                } = pc
                else {
                    return None;
                };
                let j = idx(grant.job);
                match tx {
                    Tx::None => {}
                    Tx::Open { .. } => return None, // commit_claim first (EndUnusedTx)
                    Tx::Aborted { .. } => {
                        // commit_claim failed: hand_back.
                        s.workers[wi] = self.leaving(grant, false);
                        return Some(());
                    }
                }
                let row = s.pg[j];
                if row.locked_by.is_some() {
                    return None;
                }
                if row.fence == grant.token && row.status == Status::Live {
                    s.pg[j].status = Status::Dead;
                    record_commit(&mut s.ghost, grant.job, grant.token, false, None);
                    // The DLQ publish terminates the message.
                    s.workers[wi] = self.leaving(grant, true);
                } else {
                    s.workers[wi] = self.after_refusal(&row, grant);
                }
            }
            Action::Ack { .. } => {
                let Pc::Leaving {
                    job,
                    lock,
                    ack: true,
                } = pc
                else {
                    return None;
                };
                s.nats[idx(job)] = false;
                s.workers[wi] = if lock.is_some() {
                    Pc::Leaving {
                        job,
                        lock,
                        ack: false,
                    }
                } else {
                    Pc::Idle
                };
            }
            Action::ReleaseLock { .. } => {
                let Pc::Leaving {
                    job,
                    lock: Some(g),
                    ack: false,
                } = pc
                else {
                    return None;
                };
                // `guarded_delete_txn` compares the key's create_revision with
                // the token, nothing else.
                let j = idx(job);
                if s.etcd.locks[j].is_some_and(|k| k.create_revision == g.token) {
                    s.etcd.locks[j] = None;
                }
                s.workers[wi] = Pc::Idle;
            }
            Action::LeaseExpires { .. } => {
                let lease = s.etcd.leases[wi];
                if !lease.alive || s.budget.lease_expiries == 0 {
                    return None;
                }
                s.budget.lease_expiries -= 1;
                s.etcd.leases[wi].alive = false;
                for k in s.etcd.locks.iter_mut().chain(&mut s.etcd.partitions) {
                    if k.is_some_and(|k| k.worker == w && k.epoch == lease.epoch) {
                        *k = None;
                    }
                }
            }
            Action::EstablishSession { .. } => {
                let lease = &mut s.etcd.leases[wi];
                if lease.alive {
                    return None;
                }
                lease.epoch += 1;
                lease.alive = true;
            }
            Action::PgEndsIdleTx { .. } => {
                let Pc::Running {
                    grant,
                    step,
                    tx: Tx::Open { undo },
                    poisoned,
                } = pc
                else {
                    return None;
                };
                if s.budget.pg_aborts == 0 {
                    return None;
                }
                s.budget.pg_aborts -= 1;
                let r = &mut s.pg[idx(grant.job)];
                if let Some(u) = undo {
                    r.fence = u.fence;
                    r.takeovers = u.takeovers;
                    r.released = u.released;
                }
                r.locked_by = None;
                s.workers[wi] = Pc::Running {
                    grant,
                    step,
                    tx: Tx::Aborted {
                        claim: undo.is_some(),
                    },
                    poisoned,
                };
            }
            Action::Campaign { p, phantom, .. } => self.campaign(s, w, p, phantom)?,
            Action::VerifyCampaign { p, .. }
            | Action::ClaimPartition { p, .. }
            | Action::HandOver { p, .. }
            | Action::Resign { p, .. }
            | Action::ForgetPartition { p, .. } => self.own_step(s, w, p, action)?,
            Action::ReleaseJob { .. } => self.release_job(s, w)?,
            Action::EtcdRestoreWithoutBump => return None,
        }
        Some(())
    }

    /// The state after a successful create answer: the re-read comes next,
    /// unless the switch skips it.
    fn created(&self, grant: Grant) -> Pc {
        if self.switches.verify_read {
            Pc::Created(grant)
        } else {
            Pc::Locked(grant)
        }
    }

    fn restore(&self, s: &mut State) -> Option<()> {
        if s.budget.snapshot_restores == 0 || s.etcd.revision == 0 {
            return None;
        }
        s.budget.snapshot_restores -= 1;
        s.etcd.revision -= 1;
        let rev = s.etcd.revision;
        for k in s.etcd.locks.iter_mut().chain(&mut s.etcd.partitions) {
            if k.is_some_and(|k| k.create_revision > rev) {
                *k = None;
            }
        }
        Some(())
    }

    /// Whether every job's row is terminal.
    pub fn all_terminal(&self, s: &State) -> bool {
        self.jobs().all(|j| s.pg[idx(j)].status.is_terminal())
    }
}

/// Property names, for tests and reports.
pub mod props {
    /// 1. No (job, step) committed twice.
    pub const NO_DOUBLE_COMMIT: &str = "no (job, step) is committed twice";
    /// 2. Once a claim with token t committed, no step commit with a token < t.
    pub const NO_STALE_COMMIT: &str = "no step commit under a token below a committed claim";
    /// 3. Tokens accepted per job never decrease.
    pub const TOKENS_NEVER_DECREASE: &str = "tokens accepted per job never decrease";
    /// 4. A token names one owner: no two job actors run a job under one token.
    pub const ONE_OWNER_PER_TOKEN: &str = "no two workers run a job under the same token";
    /// 5. Only a verified lock grant makes a token that can claim.
    pub const CLAIMS_FROM_REAL_LOCKS: &str = "every claim's token is a real lock's create_revision";
    /// Liveness, at the checker's terminal states.
    pub const EVENTUALLY_TERMINAL: &str = "every job eventually done or dead";
    /// Reachability: all jobs done.
    pub const SOMETIMES_ALL_DONE: &str = "sometimes every job is done";
    /// Reachability: a job finished after a takeover.
    pub const SOMETIMES_TAKEOVER_DONE: &str = "sometimes a job is done after a takeover";
    /// Reachability: a job went dead (poison check).
    pub const SOMETIMES_DEAD: &str = "sometimes a job is dead-lettered";
    /// 6. Partition mode: a partition token names one owner.
    pub const ONE_PARTITION_OWNER_PER_TOKEN: &str =
        "no two workers own or run a partition under the same token";
    /// Reachability, partition mode: a job released at a hand-over finished.
    pub const SOMETIMES_HANDOVER_DONE: &str = "sometimes a job is done after a hand-over";
}

impl Model for Tenure {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bound;
        let mut nats = [false; MAX_JOBS];
        for j in self.jobs() {
            nats[idx(j)] = true;
        }
        let row = Row {
            fence: 0,
            step: 0,
            status: Status::Live,
            takeovers: 0,
            released: false,
            locked_by: None,
        };
        vec![State {
            etcd: Etcd {
                revision: 0,
                leases: [Lease {
                    epoch: 0,
                    alive: true,
                }; MAX_WORKERS],
                locks: [None; MAX_JOBS],
                partitions: [None; MAX_PARTITIONS],
            },
            pg: [row; MAX_JOBS],
            nats,
            workers: [Pc::Idle; MAX_WORKERS],
            partition_fences: [0; MAX_PARTITIONS],
            owns: [[Own::None; MAX_PARTITIONS]; MAX_WORKERS],
            budget: Budget {
                lease_expiries: b.lease_expiries,
                pg_aborts: b.pg_aborts,
                snapshot_restores: b.snapshot_restores,
                phantom_grants: b.phantom_grants,
                handovers: b.handovers,
            },
            ghost: Ghost {
                commits: [[0; MAX_STEPS]; MAX_JOBS],
                claimed: [0; MAX_JOBS],
                accepted: [0; MAX_JOBS],
                stale_commit: false,
                token_decreased: false,
                released: [false; MAX_JOBS],
            },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for w in self.workers() {
            match s.workers[idx(w)] {
                Pc::Idle => {
                    for job in self.jobs() {
                        if s.nats[idx(job)] {
                            actions.push(Action::Fetch { w, job });
                        }
                    }
                }
                Pc::Admitted { .. } => {
                    actions.push(Action::Acquire { w, phantom: false });
                    if s.budget.phantom_grants > 0 && !s.etcd.leases[idx(w)].alive {
                        actions.push(Action::Acquire { w, phantom: true });
                    }
                }
                Pc::Created(_) => actions.push(Action::VerifyGrant { w }),
                Pc::Locked(_) => actions.push(Action::ClaimAndBegin { w }),
                Pc::Running { tx, poisoned, .. } => match (tx, poisoned) {
                    (Tx::Open { .. }, false) => {
                        actions.push(Action::CommitStep { w });
                        actions.push(Action::EndUnusedTx { w });
                    }
                    (Tx::Open { .. }, true) => actions.push(Action::EndUnusedTx { w }),
                    (Tx::None, false) => actions.push(Action::BeginStep { w }),
                    (Tx::Aborted { .. }, false) => {
                        actions.push(Action::CommitStep { w });
                        actions.push(Action::EndUnusedTx { w });
                    }
                    (Tx::None | Tx::Aborted { .. }, true) => actions.push(Action::MarkDead { w }),
                },
                Pc::Leaving { ack: true, .. } => actions.push(Action::Ack { w }),
                Pc::Leaving { ack: false, .. } => actions.push(Action::ReleaseLock { w }),
            }
            if s.budget.lease_expiries > 0 && s.etcd.leases[idx(w)].alive {
                actions.push(Action::LeaseExpires { w });
            }
            if !s.etcd.leases[idx(w)].alive {
                actions.push(Action::EstablishSession { w });
            }
            if s.budget.pg_aborts > 0
                && matches!(
                    s.workers[idx(w)],
                    Pc::Running {
                        tx: Tx::Open { .. },
                        ..
                    }
                )
            {
                actions.push(Action::PgEndsIdleTx { w });
            }
            if self.partitioned() {
                self.partition_actions(s, w, actions);
            }
        }
        if s.budget.snapshot_restores > 0 && s.etcd.revision > 0 {
            actions.push(Action::EtcdRestoreWithoutBump);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::EtcdRestoreWithoutBump => self.restore(&mut s)?,
            Action::Fetch { w, .. }
            | Action::Acquire { w, .. }
            | Action::VerifyGrant { w }
            | Action::ClaimAndBegin { w }
            | Action::EndUnusedTx { w }
            | Action::BeginStep { w }
            | Action::CommitStep { w }
            | Action::MarkDead { w }
            | Action::Ack { w }
            | Action::ReleaseLock { w }
            | Action::LeaseExpires { w }
            | Action::EstablishSession { w }
            | Action::PgEndsIdleTx { w }
            | Action::Campaign { w, .. }
            | Action::VerifyCampaign { w, .. }
            | Action::ClaimPartition { w, .. }
            | Action::HandOver { w, .. }
            | Action::Resign { w, .. }
            | Action::ForgetPartition { w, .. }
            | Action::ReleaseJob { w } => {
                if idx(w) >= self.bound.workers.min(MAX_WORKERS) {
                    return None;
                }
                self.step_to(&mut s, w, action)?;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = vec![
            Property::always(props::NO_DOUBLE_COMMIT, |_: &Tenure, s: &State| {
                s.ghost.commits.iter().flatten().all(|c| *c <= 1)
            }),
            Property::always(props::NO_STALE_COMMIT, |_: &Tenure, s: &State| {
                !s.ghost.stale_commit
            }),
            Property::always(props::TOKENS_NEVER_DECREASE, |_: &Tenure, s: &State| {
                !s.ghost.token_decreased
            }),
            Property::always(props::ONE_OWNER_PER_TOKEN, |_: &Tenure, s: &State| {
                let owners: Vec<(u8, u8)> = s
                    .workers
                    .iter()
                    .filter_map(Pc::owner_of)
                    .map(|(j, t, _)| (j, t))
                    .collect();
                owners
                    .iter()
                    .enumerate()
                    .all(|(i, o)| !owners[i + 1..].contains(o))
            }),
            Property::always(props::CLAIMS_FROM_REAL_LOCKS, |_: &Tenure, s: &State| {
                s.workers
                    .iter()
                    .filter_map(Pc::owner_of)
                    .all(|(_, _, real)| real)
            }),
            Property::eventually(props::EVENTUALLY_TERMINAL, |m: &Tenure, s: &State| {
                m.all_terminal(s)
            }),
            Property::sometimes(props::SOMETIMES_ALL_DONE, |m: &Tenure, s: &State| {
                m.jobs().all(|j| s.pg[idx(j)].status == Status::Done)
            }),
            Property::sometimes(props::SOMETIMES_TAKEOVER_DONE, |m: &Tenure, s: &State| {
                m.jobs()
                    .any(|j| s.pg[idx(j)].status == Status::Done && s.pg[idx(j)].takeovers > 0)
            }),
            Property::sometimes(props::SOMETIMES_DEAD, |m: &Tenure, s: &State| {
                m.jobs().any(|j| s.pg[idx(j)].status == Status::Dead)
            }),
        ];
        if self.partitioned() {
            all.extend(crate::partition::properties());
        }
        all
    }
}

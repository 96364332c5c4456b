//! The weakened protocols of issue 24 and the property each one breaks.

use crate::model::{Bound, EqualToken, PartitionFence, Switches, props};

/// A weakened protocol: its switches, and the property a counterexample is
/// expected for.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// Short name.
    pub name: &'static str,
    /// What is switched off.
    pub what: &'static str,
    /// The protocol.
    pub switches: Switches,
    /// The bound its counterexample is found at.
    pub bound: Bound,
    /// The property it breaks.
    pub breaks: &'static str,
}

/// (a) The claim without `fence < $tok`.
pub const NO_CLAIM_FENCE: Variant = Variant {
    name: "(a) claim without fence < token",
    what: "claim_sql without `AND fence < $2`",
    switches: Switches {
        claim_fence: false,
        ..Switches::FAITHFUL
    },
    bound: Bound::SMALL,
    breaks: props::NO_STALE_COMMIT,
};

/// (b) The step transaction without `fence = $tok` (admission, and the CAS
/// that repeats it under the same row lock).
pub const NO_ADMISSION_FENCE: Variant = Variant {
    name: "(b) admission without fence = token",
    what: "admission `SELECT .. FOR UPDATE` and step CAS without `fence = $tok`",
    switches: Switches {
        admission_fence: false,
        cas_fence: false,
        ..Switches::FAITHFUL
    },
    bound: Bound::SMALL,
    breaks: props::NO_STALE_COMMIT,
};

/// (c) No linearizable re-read after the lock create.
pub const NO_VERIFY_READ: Variant = Variant {
    name: "(c) no verification read",
    what: "Session::finish's re-read skipped (a create's own answer makes the token)",
    switches: Switches {
        verify_read: false,
        ..Switches::FAITHFUL
    },
    bound: Bound::SMALL,
    breaks: props::CLAIMS_FROM_REAL_LOCKS,
};

/// (d) A claim on a fresh lock accepts `fence == token` (today's code).
pub const EQUAL_TOKEN_ACCEPTED: Variant = Variant {
    name: "(d) equal token accepted after a revision regression",
    what: "claim_refused answers Ours for fence == token (framework today)",
    switches: Switches {
        equal_token: EqualToken::AcceptAsOurs,
        ..Switches::FAITHFUL
    },
    bound: Bound::SMALL,
    breaks: props::ONE_OWNER_PER_TOKEN,
};

/// (d') Issue 15 fixed in the claim only: the equal token is refused at the
/// claim, but a claim rolled back by the server still admits its step later.
pub const EQUAL_TOKEN_AFTER_FAILED_CLAIM_COMMIT: Variant = Variant {
    name: "(d') strict claim, but a failed claim commit still admits its step",
    what: "end_unused_later's failed commit_claim followed by begin_step (framework today)",
    switches: Switches {
        equal_token: EqualToken::AlarmAtClaimOnly,
        ..Switches::FAITHFUL
    },
    bound: Bound::SMALL,
    breaks: props::ONE_OWNER_PER_TOKEN,
};

/// (pa) Partition mode: the owner's claim in `partition_fences` accepts a
/// fence equal to its token (`WHERE f.fence <= EXCLUDED.fence`).
pub const PARTITION_FENCE_EQUAL: Variant = Variant {
    name: "(pa) partition claim accepts fence == token",
    what: "tenure_claim_partition with `f.fence <= EXCLUDED.fence`",
    switches: Switches {
        partition_fence: PartitionFence::AcceptEqual,
        ..Switches::FAITHFUL
    },
    bound: Bound::PARTITIONS_RESTORE,
    breaks: props::ONE_OWNER_PER_TOKEN,
};

/// (pb) Partition mode: no partition claim at all; the elected owner claims
/// jobs (`fence <= $tok`) right away.
pub const NO_PARTITION_FENCE: Variant = Variant {
    name: "(pb) jobs claimed with fence <= token, partition fence never raised",
    what: "Rebalance::take without FenceStore::claim_partition",
    switches: Switches {
        partition_fence: PartitionFence::Skip,
        ..Switches::FAITHFUL
    },
    bound: Bound::PARTITIONS_RESTORE,
    breaks: props::ONE_OWNER_PER_TOKEN,
};

/// (pc) Partition mode: the job claim without `fence <= $tok`.
pub const PARTITION_NO_CLAIM_FENCE: Variant = Variant {
    name: "(pc) partition job claim without fence <= token",
    what: "tenure_claim(.., p_partitioned = true, ..) without its fence condition",
    switches: Switches {
        claim_fence: false,
        ..Switches::FAITHFUL
    },
    bound: Bound::PARTITIONS,
    breaks: props::NO_STALE_COMMIT,
};

/// (pd) Partition mode: the step transaction without `fence = $tok`.
pub const PARTITION_NO_ADMISSION_FENCE: Variant = Variant {
    name: "(pd) partition mode, admission and CAS without fence = token",
    what: "tenure_admit and tenure_step_cas without `fence = $tok`",
    switches: Switches {
        admission_fence: false,
        cas_fence: false,
        ..Switches::FAITHFUL
    },
    bound: Bound::PARTITIONS,
    breaks: props::NO_STALE_COMMIT,
};

/// (pe) Partition mode: no re-read after the campaign's create, with an issue
/// 11456 grant.
pub const PARTITION_NO_VERIFY_READ: Variant = Variant {
    name: "(pe) partition campaign without the verification read",
    what: "campaign_at without verify_leader",
    switches: Switches {
        verify_read: false,
        ..Switches::FAITHFUL
    },
    bound: Bound {
        phantom_grants: 1,
        ..Bound::PARTITIONS
    },
    breaks: props::CLAIMS_FROM_REAL_LOCKS,
};

/// All weakened variants of one lock per job.
pub const ALL: [Variant; 5] = [
    NO_CLAIM_FENCE,
    NO_ADMISSION_FENCE,
    NO_VERIFY_READ,
    EQUAL_TOKEN_ACCEPTED,
    EQUAL_TOKEN_AFTER_FAILED_CLAIM_COMMIT,
];

/// All weakened variants of partition mode.
pub const PARTITIONS: [Variant; 5] = [
    PARTITION_FENCE_EQUAL,
    NO_PARTITION_FENCE,
    PARTITION_NO_CLAIM_FENCE,
    PARTITION_NO_ADMISSION_FENCE,
    PARTITION_NO_VERIFY_READ,
];

/// Partition mode's liveness mutation (the negative control of its AG EF
/// check): the job claim strict (`fence < $tok`) as with a lock per job, so an
/// owner cannot take back a job it handed back under the same token.
pub const PARTITION_STRICT_JOB_CLAIM: Switches = Switches {
    partition_claim_equal: false,
    ..Switches::FAITHFUL
};

/// Not a counterexample: only the admission's `fence = $tok` dropped; the
/// step CAS (`tenure_step_cas`) checks it again under the same row lock.
pub const ADMISSION_ONLY: Switches = Switches {
    admission_fence: false,
    ..Switches::FAITHFUL
};

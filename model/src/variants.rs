//! The weakened protocols of issue 24 and the property each one breaks.

use crate::model::{EqualToken, Switches, props};

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
    breaks: props::ONE_OWNER_PER_TOKEN,
};

/// All weakened variants.
pub const ALL: [Variant; 5] = [
    NO_CLAIM_FENCE,
    NO_ADMISSION_FENCE,
    NO_VERIFY_READ,
    EQUAL_TOKEN_ACCEPTED,
    EQUAL_TOKEN_AFTER_FAILED_CLAIM_COMMIT,
];

/// Not a counterexample: only the admission's `fence = $tok` dropped; the
/// step CAS (`tenure_step_cas`) checks it again under the same row lock.
pub const ADMISSION_ONLY: Switches = Switches {
    admission_fence: false,
    ..Switches::FAITHFUL
};

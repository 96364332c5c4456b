//! `ui/pass/*.rs`: every accepted way of writing a job compiles (without a
//! warning: `make lint` denies them, and three of the files themselves) and
//! runs. Built by the workspace's own test build rather than by trybuild:
//! with compile-fail cases only, trybuild checks its copy of the dependencies
//! (`cargo check`) instead of building and linking them, which was the
//! longest cold step of `make test`.

// `ON_DEAD` is a constant: the point is which value the macro gave it.
#[allow(clippy::assertions_on_constants)]
#[path = "ui/pass/on_dead.rs"]
mod on_dead;
// Deliberate spellings the macro must accept (`self: &Self`, a named lifetime).
#[allow(clippy::needless_arbitrary_self_type, clippy::needless_lifetimes)]
#[path = "ui/pass/spellings.rs"]
mod spellings;
#[path = "ui/pass/timeouts.rs"]
mod timeouts;
#[path = "ui/pass/transfer.rs"]
mod transfer;

#[test]
fn on_dead_hooks() {
    on_dead::main();
}

#[test]
fn spellings_accepted() {
    spellings::main();
}

#[test]
fn timeouts_accepted() {
    timeouts::main();
}

#[test]
fn transfer_runs() {
    transfer::main();
}

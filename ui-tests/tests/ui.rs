//! Compile-time behaviour of `tenure`, in one trybuild pass (one build of the test project
//! instead of one per file: trybuild builds its own copy of every dependency).
//!
//! * `#[tenure::job]` / `#[tenure::step]`: `ui/fail/*.rs` must fail with
//!   exactly the diagnostics in the `.stderr` snapshot next to them (these
//!   are the messages users see).
//! * `#[tenure::test]`: `ui/fail/test_*.rs`, its misuse diagnostics (the
//!   passing form needs the dev stack and runs in `tests/tests/kit.rs`).
//! * Invariant 1: only a verified lock grant makes a
//!   [`FencingToken`](tenure::FencingToken), the only type `claim` and
//!   `begin_step` take. A number read off the wire or a row (`ObservedFence`) can
//!   be compared, never used to claim: `ui/token/*.rs` must fail to compile with
//!   exactly the diagnostics in their snapshots.
//!
//! Compile-fail cases only: trybuild then checks its copy of the dependencies
//! (`cargo check`) instead of building them. The forms that must compile and
//! run, `ui/pass/*.rs`, are modules of `tests/pass.rs`.
//!
//! Regenerate snapshots with `TRYBUILD=overwrite`, then read every one.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.compile_fail("tests/ui/token/*.rs");
}

//! Invariant 1 at compile time: only a verified lock grant makes a
//! [`FencingToken`](tenure::FencingToken), the only type `claim` and `begin_step`
//! take. A number read off the wire or a row (`ObservedFence`) can be compared,
//! never used to claim: `ui/token/*.rs` must fail to compile with exactly the
//! diagnostics in their `.stderr` snapshots (regenerate with
//! `TRYBUILD=overwrite`, then read them).

#[test]
fn forged_tokens_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/token/*.rs");
}

//! Compile-time behaviour of `#[tenure::job]` / `#[tenure::step]`: `ui/pass/*.rs`
//! must compile and run; `ui/fail/*.rs` must fail with exactly the diagnostics in
//! the `.stderr` snapshot next to them (regenerate with `TRYBUILD=overwrite`, then
//! read every snapshot: these are the messages users see).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

//! Runnable examples for tenure live under `examples/`; see `cargo run --example ledger`.

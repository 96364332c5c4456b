//! Benchmarks for tenure; see `cargo bench -p tenure-benches`.

#!/usr/bin/env bash
# `make bench`: the pipeline benchmark, then Tenure next to apalis
# (benches/peers, its own package and lock), then both summary lines together,
# so one command shows the comparison (BENCHMARKS.md). Each run's full output
# stays in target/tenure-bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/tenure-bench
mkdir -p "$out"
cargo bench -p tenure-benches --bench pipeline 2>&1 | tee "$out/pipeline.log"
cargo run --release --manifest-path benches/peers/Cargo.toml 2>&1 | tee "$out/peers.log"
echo
echo "== summary"
grep -h '^pipeline: ' "$out/pipeline.log"
grep -h '^peers: ' "$out/peers.log"

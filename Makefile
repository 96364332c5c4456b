.PHONY: setup check-fresh check-features demo test lint bench torture

# Installs the missing Debian packages, then verifies the files and behaviour the
# build and the tests rely on (fails with the name of the package to install).
setup:
	bash scripts/setup.sh

# Fails if a file the build or the tests use comes from a package setup.sh does
# not install (what a machine that happens to have it would hide).
check-fresh: setup
	bash scripts/check-fresh.sh

# Fails if tenure's test-only `testing` or `devstack` feature reaches the CLI,
# a plain `cargo build --release` or a `cargo build --workspace`.
check-features:
	bash scripts/check-features.sh

demo: setup
	cargo run --example ledger

# At least four tests at a time in each test binary (cargo's default is one
# per core): most integration suites wait on servers and timers (lease TTLs,
# cron ticks, redeliveries) with the CPU 50-80% idle on a 2-core machine, and
# cargo runs the binaries one after another. Measured there: schedule 74 s ->
# 32 s, runtime 56 s -> 38 s, operations 43 s -> 25 s. The torture runs cap
# themselves at two (tests/tests/torture.rs). RUST_TEST_THREADS, if set, wins.
TEST_THREADS = $(shell n=$$(nproc); echo $$(( n < 4 ? 4 : n )))

test: setup check-fresh check-features
	RUST_TEST_THREADS=$${RUST_TEST_THREADS:-$(TEST_THREADS)} cargo test --workspace --no-fail-fast

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

# The pipeline benchmark, then Tenure next to apalis (benches/peers), then
# both summary lines together (scripts/bench.sh).
bench: setup
	bash scripts/bench.sh

torture: setup
	cargo run --release -p tenure-tests --features harness --bin torture -- --jobs 2000 --workers 3 --faults 100 --seed 1

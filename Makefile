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

test: setup check-fresh check-features
	cargo test --workspace --no-fail-fast

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: setup
	cargo bench -p tenure-benches --bench pipeline

torture: setup
	cargo run --release -p tenure-tests --features harness --bin torture -- --jobs 2000 --workers 3 --faults 100 --seed 1

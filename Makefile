.PHONY: setup demo test lint bench torture

setup:
	bash scripts/setup.sh

demo: setup
	cargo run --example ledger

test: setup
	cargo test --workspace --no-fail-fast

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: setup
	cargo bench -p tenure-benches --bench pipeline

torture: setup
	cargo run --release -p tenure-tests --bin torture -- --jobs 2000 --workers 3 --faults 100 --seed 1

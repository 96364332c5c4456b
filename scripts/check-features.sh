#!/usr/bin/env bash
# Fails if test-only code can reach a release build: the `testing` feature of
# `tenure` (raw token constructors, the unfenced negative control) must be off in
# the CLI's own dependency tree and in what a plain `cargo build --release` at the
# workspace root builds (the default members). Test and bench packages enable it
# for themselves only.
set -euo pipefail
cd "$(dirname "$0")/.."
failures=0
check() {
  local what=$1
  shift
  if cargo tree -q -e normal,build,features -i tenure --prefix none "$@" 2>/dev/null |
    grep -q '^tenure feature "testing"'; then
    echo "check-features: tenure's \"testing\" feature is on in $what" >&2
    failures=$((failures + 1))
  fi
}
check "tenure-cli's dependency tree" -p tenure-cli
check "the default members (cargo build --release at the root)"
[ "$failures" -eq 0 ] || exit 1
echo "check-features: no test-only feature reaches the CLI or a default release build"

#!/usr/bin/env bash
# Fails if test-only code can reach a build of the CLI: neither the `testing`
# feature of `tenure` (raw token constructors, fault injection, the unfenced
# negative control) nor its `devstack` feature (spawning servers with throwaway
# credentials) may be on in
#   - the CLI's own dependency tree (`cargo build -p tenure-cli`),
#   - what a plain `cargo build --release` at the workspace root builds (the
#     default members, the CLI among them), and
#   - what `cargo build --workspace` builds (every member; features are unified
#     across them, so one member's normal dependency on `tenure/testing` would be
#     linked into the CLI built alongside).
# Test, bench and example packages enable them for their own test, bench and
# example targets only (a dev-dependency on themselves with feature `harness`).
set -euo pipefail
cd "$(dirname "$0")/.."
failures=0
check() {
  local what=$1
  shift
  local features
  features=$(cargo tree -q -e normal,build,features -i tenure --prefix none "$@" 2>/dev/null)
  for feature in testing devstack; do
    if grep -q "^tenure feature \"$feature\"" <<<"$features"; then
      echo "check-features: tenure's \"$feature\" feature is on in $what" >&2
      failures=$((failures + 1))
    fi
  done
}
check "tenure-cli's dependency tree" -p tenure-cli
check "the default members (cargo build --release at the root)"
check "the whole workspace (cargo build --workspace)" --workspace
[ "$failures" -eq 0 ] || exit 1
echo "check-features: neither testing nor devstack reaches the CLI, a default release build or a workspace build"

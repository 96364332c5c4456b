#!/usr/bin/env bash
# Bisects Tenure's throughput on the peers shape (issue 33.2): builds
# `benches/bisect` (the peers shape's Tenure half) against each COMMIT in a
# worktree of its own, starts one dev stack (this checkout's, so every commit
# meets the same servers), and runs every commit in turn, ROUNDS times, the
# order reversed each round, per-job locks and (where the commit has them)
# 8 partitions. One line per run on stdout and in $BISECT_DIR/results.txt.
#
#   benches/bisect.sh [-r ROUNDS] [-j JOBS] [-c C] COMMIT...
#
# BISECT_DIR (default /tmp/tenure-bisect) keeps the builds (a second call
# with the same commits builds nothing); its worktrees are removed at the end.
set -euo pipefail
rounds=2 jobs=5000 c=32
while getopts "r:j:c:" o; do
  case $o in r) rounds=$OPTARG ;; j) jobs=$OPTARG ;; c) c=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-r ROUNDS] [-j JOBS] [-c C] COMMIT..." >&2; exit 2; }
repo=$(git rev-parse --show-toplevel)
dir=${BISECT_DIR:-/tmp/tenure-bisect}
mkdir -p "$dir/bin" "$dir/wt"
export CARGO_TARGET_DIR=$dir/target

# The dev stack holder, from this checkout.
if [ ! -x "$dir/bin/stack-holder" ]; then
  cargo build --release --quiet --manifest-path "$repo/benches/bisect/Cargo.toml" \
    --features stack --bin stack-holder
  cp "$CARGO_TARGET_DIR/release/stack-holder" "$dir/bin/"
fi

# One build per commit: the crate copied in with the commit's lock, and the
# features for what moved since the oldest API.
labels=()
for commit in "$@"; do
  sha=$(git -C "$repo" rev-parse --short=7 "$commit")
  labels+=("$sha")
  [ -x "$dir/bin/$sha" ] && continue
  wt=$dir/wt/$sha
  [ -d "$wt" ] || git -C "$repo" worktree add --detach --quiet "$wt" "$sha"
  rm -rf "$wt/benches/bisect"
  cp -r "$repo/benches/bisect" "$wt/benches/bisect"
  rm -rf "$wt/benches/bisect/target"
  cp "$wt/Cargo.lock" "$wt/benches/bisect/Cargo.lock"
  features=()
  grep -q '^pub mod runtime;' "$wt/framework/src/lib.rs" && features+=(old_paths)
  grep -q 'pub partitions:' "$wt/framework/src/config.rs" && features+=(partitions)
  echo "bisect: building $sha (features: ${features[*]:-none})" >&2
  cargo build --release --quiet --manifest-path "$wt/benches/bisect/Cargo.toml" \
    --bin tenure-bisect --features "$(IFS=,; echo "${features[*]:-}")"
  cp "$CARGO_TARGET_DIR/release/tenure-bisect" "$dir/bin/$sha"
  if printf '%s\n' "${features[@]:-}" | grep -qx partitions; then touch "$dir/bin/$sha.partitions"; fi
  git -C "$repo" worktree remove --force "$wt"
done

# The servers, kept until the holder's stdin closes.
coproc HOLDER { exec "$dir/bin/stack-holder"; }
while read -r line <&"${HOLDER[0]}"; do
  [ "$line" = READY ] && break
  eval "$line"
done
export BISECT_JOBS=$jobs BISECT_C=$c
for ((r = 1; r <= rounds; r++)); do
  order=("${labels[@]}")
  if ((r % 2 == 0)); then
    order=(); for ((i = ${#labels[@]} - 1; i >= 0; i--)); do order+=("${labels[$i]}"); done
  fi
  for sha in "${order[@]}"; do
    modes=(0)
    [ -e "$dir/bin/$sha.partitions" ] && modes+=(8)
    for p in "${modes[@]}"; do
      out=$(BISECT_LABEL=$sha BISECT_PARTITIONS=$p "$dir/bin/$sha" 2>>"$dir/stderr.log" | tail -n 1)
      echo "$out round=$r loadavg=\"$(cut -d' ' -f1-3 /proc/loadavg)\"" | tee -a "$dir/results.txt"
    done
  done
done
holder_in=${HOLDER[1]}
eval "exec ${holder_in}>&-"
wait "$HOLDER_PID"

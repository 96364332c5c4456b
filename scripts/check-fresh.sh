#!/usr/bin/env bash
# Checks that scripts/setup.sh's package list is complete: for every file the
# build, the dev stack and the tests use, finds the Debian package that owns it
# (dpkg -S) and fails if that package is not in the list. A machine that happens
# to have a package installed (CI did, for libprotobuf-dev) hides a missing
# install step; this check does not.
#
#   scripts/check-fresh.sh [SETUP_SCRIPT]   (default: scripts/setup.sh next to this file)
#
# What is checked: the build's files (protoc, the well-known .proto files, the C
# compiler and libc's start files), the PostgreSQL and MariaDB binaries the dev stack runs,
# and every program the Rust sources start (`Command::new("x")`, `program: "x"`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
setup=${1:-$here/setup.sh}
mapfile -t listed < <(bash "$setup" --packages)

# Files that no source line names: the build's and the dev stack's fixed paths.
fixed_files() {
  command -v protoc || echo /usr/bin/protoc
  echo /usr/include/google/protobuf/descriptor.proto
  command -v gcc || echo /usr/bin/gcc
  gcc -print-file-name=crt1.o 2>/dev/null || true
  local pg_bin
  pg_bin=$(grep -rhoE 'const PG_BIN: &str = "[^"]+"' "$root/framework/src" | sed -E 's/.*"(.*)"/\1/')
  echo "$pg_bin/initdb"
  echo "$pg_bin/postgres"
  echo "$pg_bin/pg_ctl"
  echo "$pg_bin/pg_basebackup"
  # The dev stack's MariaDB binaries (`const MARIADB_...: &str = "/usr/..."`).
  grep -rhoE 'const MARIADB_[A-Z_]+: &str = "[^"]+"' "$root/framework/src" | sed -E 's/.*"(.*)"/\1/'
}

# Programs the Rust sources start by name.
programs() {
  grep -rhoE 'Command::new\("[^"]+"\)|program: "[^"]+"\.into\(\)' \
    "$root/framework/src" "$root/tests/src" "$root/benches" "$root/examples" "$root/cli/src" "$root/cli/tests" 2>/dev/null |
    sed -E 's/.*"([^"]+)".*/\1/' | sort -u
}

# owner PATH: the package owning PATH (also under its merged-/usr alias or its
# resolved link target), or nothing.
owner() {
  local p=$1 candidate
  for candidate in "$p" "${p#/usr}" "/usr$p" "$(readlink -f "$p" 2>/dev/null)"; do
    [ -n "$candidate" ] || continue
    dpkg -S "$candidate" 2>/dev/null | awk -F': ' -v f="$candidate" '$2 == f { sub(/:.*/, "", $1); print $1; exit }' | grep . && return 0
  done
  return 0
}

failures=0
check() {
  local what=$1 path=$2 pkg
  if [ -z "$path" ] || [ ! -e "$path" ]; then
    echo "check-fresh: $what ${path:-} is not on this machine; run scripts/setup.sh first" >&2
    failures=$((failures + 1))
    return
  fi
  pkg=$(owner "$path" | head -1 | tr ',' '\n' | head -1 | xargs)
  if [ -z "$pkg" ]; then
    echo "check-fresh: note: $path ($what) belongs to no Debian package (rustup's, or built locally)"
    return
  fi
  if ! printf '%s\n' "${listed[@]}" | grep -qx "$pkg"; then
    echo "check-fresh: $path ($what) comes from the Debian package $pkg, which $setup does not install" >&2
    failures=$((failures + 1))
  fi
}

while read -r f; do
  [ -n "$f" ] && check "a build or dev-stack file" "$f"
done < <(fixed_files)
while read -r prog; do
  [ -n "$prog" ] || continue
  path=$(command -v "$prog" 2>/dev/null || true)
  case "$path" in /*) ;; *) path=$(type -P "$prog" 2>/dev/null || true) ;; esac
  check "program $prog" "$path"
done < <(programs)

if [ "$failures" -ne 0 ]; then
  echo "check-fresh: $failures file(s) need a package that scripts/setup.sh does not list" >&2
  exit 1
fi
echo "check-fresh: every file the build and tests use comes from a package setup.sh installs"

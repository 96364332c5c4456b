#!/usr/bin/env bash
# Installs the Debian packages Tenure's build, dev stack and tests need (only those
# that are missing), then verifies, every time it runs, the files and behaviour
# they rely on. A missing piece prints one line naming the package that provides
# it and exits non-zero, so `make demo` / `make test` fail here, not deep inside a
# build script.
#
#   scripts/setup.sh             install what is missing, then verify
#   scripts/setup.sh --packages  print the package list (for scripts/check-fresh.sh)
#
# Idempotent and fast when everything is present.
set -euo pipefail

# Every Debian package the build, the demo and the tests use. scripts/check-fresh.sh
# fails if a file they need belongs to a package that is not named here.
packages=(
  etcd-server       # etcd 3.4: the coordinator (three members in the dev stack)
  etcd-client       # etcdctl: snapshots and member operations in the torture test
  nats-server       # NATS 2.9 with JetStream: the queue
  postgresql-15     # initdb / postgres 15: the resource
  postgresql-client-15 # pg_basebackup: the dev stack's opt-in PostgreSQL standby
  mariadb-server-core # MariaDB 10.11 (mariadbd, mariadb-install-db): the MySQL-protocol fenced resource
  mariadb-server    # the `mysql` user the dev stack runs mariadbd as (it refuses root)
  redis-server      # Redis 7.0: the TTL lock of the torture test's negative control (redis-lock)
  protobuf-compiler # protoc, for etcd-client's build script
  libprotobuf-dev   # google/protobuf/*.proto, imported by etcd's protos (a Recommends of protoc only)
  gcc               # C code in dependencies (ring, through the cc crate)
  libc6-dev         # crt1.o and libc headers for linking
  util-linux        # setpriv, runuser: servers run as the postgres user
  procps            # kill: the torture test signals its workers by pid
  chromium          # headless browser: the web view's browser tests (cli/tests/web.rs)
  chromium-driver   # chromedriver: WebDriver for those tests, on a loopback port
  docker-compose    # `docker-compose config`: validates deploy/compose.yaml without a daemon (examples/tests/deploy.rs)
)

if [ "${1:-}" = "--packages" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

install_missing() {
  local missing=() p
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q -o DPkg::Lock::Timeout=600
  # Do not let the postgresql package start a system cluster: the dev stack runs
  # its own servers on free loopback ports.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
    trap "$sudo rm -f /usr/sbin/policy-rc.d" EXIT
  fi
  # Another apt (a second checkout setting up) holds the lock: wait for it.
  $sudo apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}"
}

failures=0
# fail PACKAGE WHAT: one line naming what is missing and who provides it.
fail() {
  echo "setup: $2 (install the Debian package $1)" >&2
  failures=$((failures + 1))
}

# expect PACKAGE PATTERN COMMAND...: COMMAND runs and its output matches PATTERN.
expect() {
  local package=$1 pattern=$2 out
  shift 2
  if ! out=$("$@" 2>&1); then
    fail "$package" "\`$*\` does not run"
  elif ! grep -Eq "$pattern" <<<"$out"; then
    fail "$package" "\`$*\` printed $(head -1 <<<"$out"), expected /$pattern/"
  fi
}

verify_protoc() {
  command -v protoc >/dev/null || { fail protobuf-compiler "protoc is missing"; return; }
  local dir
  dir=$(mktemp -d)
  cat >"$dir/probe.proto" <<'PROTO'
syntax = "proto3";
import "google/protobuf/descriptor.proto";
message Probe { google.protobuf.FileDescriptorProto file = 1; }
PROTO
  if ! protoc -I"$dir" --include_imports --descriptor_set_out="$dir/out.pb" "$dir/probe.proto" >/dev/null 2>&1; then
    fail libprotobuf-dev "protoc cannot compile a .proto importing google/protobuf/descriptor.proto"
  fi
  rm -rf "$dir"
}

verify() {
  verify_protoc
  expect etcd-server '^etcd Version: 3\.4\.' etcd --version
  expect etcd-client 'etcdctl version: 3\.4\.' etcdctl version
  expect nats-server '^nats-server: v2\.(9|[1-9][0-9])\.' nats-server --version
  expect postgresql-15 '\(PostgreSQL\) 15\.' /usr/lib/postgresql/15/bin/initdb --version
  expect postgresql-15 '\(PostgreSQL\) 15\.' /usr/lib/postgresql/15/bin/postgres --version
  expect postgresql-15 '\(PostgreSQL\) 15\.' /usr/lib/postgresql/15/bin/pg_ctl --version
  expect postgresql-client-15 '\(PostgreSQL\) 15\.' /usr/lib/postgresql/15/bin/pg_basebackup --version
  expect gcc 'gcc' gcc --version
  [ -e "$(gcc -print-file-name=crt1.o 2>/dev/null)" ] || fail libc6-dev "crt1.o is missing: programs cannot be linked"
  expect util-linux 'util-linux' setpriv --version
  expect util-linux 'util-linux' runuser --version
  expect procps 'SIG|HUP' /bin/kill -l
  expect mariadb-server-core 'Ver 10\.11\.' /usr/sbin/mariadbd --version
  [ -x /usr/bin/mariadb-install-db ] || fail mariadb-server-core "mariadb-install-db is missing"
  id -u mysql >/dev/null 2>&1 || fail mariadb-server "the mysql user is missing"
  expect redis-server '^Redis server v=7\.' redis-server --version
  verify_chromium
  expect docker-compose '^docker-compose version 1\.' docker-compose version
}

# The browser tests drive headless chromium through chromedriver: both answer,
# and headless chromium renders a page (as root it needs --no-sandbox).
verify_chromium() {
  expect chromium '^Chromium [0-9]+\.' chromium --version
  expect chromium-driver '^ChromeDriver [0-9]+\.' chromedriver --version
  expect chromium 'tenure-headless-ok' timeout 60 chromium --headless --no-sandbox --disable-gpu \
    --user-data-dir="$(mktemp -d)" --dump-dom 'data:text/html,<p id=x>tenure-headless-ok</p>'
}

install_missing
verify
if [ "$failures" -ne 0 ]; then
  echo "setup: $failures check(s) failed" >&2
  exit 1
fi

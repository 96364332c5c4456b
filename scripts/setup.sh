#!/usr/bin/env bash
# Installs the Debian packages Tenure's dev stack, tests and build need, only those
# that are missing. Idempotent and fast when everything is present.
set -euo pipefail

packages=(etcd-server etcd-client nats-server postgresql protobuf-compiler util-linux)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Do not let the postgresql package start a system cluster: the dev stack runs
# its own servers on free loopback ports.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

for bin in etcd nats-server protoc /usr/lib/postgresql/15/bin/initdb; do
  command -v "$bin" >/dev/null || { echo "setup: $bin still missing after install" >&2; exit 1; }
done

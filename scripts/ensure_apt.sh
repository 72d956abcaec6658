#!/usr/bin/env bash
# Install the Debian packages the integration tests run for real, if missing
# (shellcheck: the node scripts `sluice launch` writes are checked with it).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v prometheus >/dev/null || need+=(prometheus)
command -v shellcheck >/dev/null || need+=(shellcheck)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
echo ">> apt-get install ${need[*]}"
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

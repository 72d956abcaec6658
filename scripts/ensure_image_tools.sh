#!/usr/bin/env bash
# Install, if missing, the Debian packages `make image` and `make image-test` use: buildah builds
# the images, podman (with runc) runs them, mmdebstrap makes the Debian base from Debian's
# packages where no image registry can be reached (../shared/ENVIRONMENT.md, "Containers").
# Idempotent: a second run installs nothing.
set -euo pipefail
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
echo ">> apt-get install ${need[*]}"
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

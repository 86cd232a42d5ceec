#!/usr/bin/env bash
# Start real vLLM (CPU build) in the foreground. Run from the repository root after
# tests/live/install.sh.
#
#   tests/live/serve.sh PORT [extra vllm args...]
#
# Default: SmolLM2-135M-Instruct served as "smollm2-135m" (bfloat16, max-model-len 2048).
# Embeddings (all-MiniLM-L6-v2, 384 dims):
#   LIVE_MODEL=.live/minilm LIVE_NAME=minilm LIVE_DTYPE=float32 LIVE_MAX_MODEL_LEN=256 \
#     tests/live/serve.sh PORT --runner pooling
# Ready when GET /health answers 200 (~65-105 s for the chat model, ~50 s for embeddings).
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 PORT [extra vllm args]" >&2
    exit 2
fi
PORT="$1"; shift
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
exec .venv-live/bin/python -m vllm.entrypoints.openai.api_server \
    --model "${LIVE_MODEL:-.live/smollm2-hf}" \
    --served-model-name "${LIVE_NAME:-smollm2-135m}" \
    --host 127.0.0.1 --port "$PORT" --max-model-len "${LIVE_MAX_MODEL_LEN:-2048}" \
    --dtype "${LIVE_DTYPE:-bfloat16}" "$@"

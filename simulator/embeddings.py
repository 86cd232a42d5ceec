"""``POST /v1/embeddings`` for a pooling model: deterministic unit vectors.

An input's vector is a bag of words: the sum of one fixed pseudo-random direction per content
word (``lexicon.content_words``), normalised. Equal inputs embed equally, and cosine similarity
follows the words two texts share, as a real embedding model's roughly does, so checks built
on similarity (groundedness) can be tested. An input with no content word gets a direction
drawn from its whole text. Unless ``--no-matryoshka``, the model behaves as a
Matryoshka model: ``dimensions`` keeps the leading components and renormalises.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from simulator import tokens
from simulator.asgi import DisconnectWatch, Receive, Send, send_response
from simulator.engine import Sequence
from simulator.errors import bad_request, model_not_found, validation_error, vllm_validation
from simulator.faults import exit_process_soon, strike_before_work
from simulator.lexicon import content_words
from simulator.protocol import check_prompt_length
from simulator.state import Simulator
from simulator.validation import Body, Invalid, format_error, to_int, to_str

# An encoder's tokenizer wraps every input in [CLS] ... [SEP].
SPECIAL_TOKENS = 2
# vLLM validates against a union of embedding request types; with no `input`, pydantic
# reports each member's missing field, in this order.
_MISSING_INPUT_FIELDS = ("input", "messages", "messages", "messages", "input", "messages", "input")

EncodedInput = tuple[str | None, tuple[int, ...] | None]


def embedding_vector(text: str | None, ids: tuple[int, ...] | None, dim: int) -> list[float]:
    words = content_words(text) if text is not None else [f"#{i}" for i in ids or ()]
    if not words:
        source = text.encode() if text is not None else repr(ids).encode()
        raw = hashlib.shake_256(source).digest(4 * dim)
        return _unit(struct.unpack(f"<{dim}i", raw))
    total = np.zeros(dim)
    for word, count in Counter(words).items():
        total += count * _direction(word, dim)
    return _unit(total.tolist())


@lru_cache(maxsize=16384)
def _direction(word: str, dim: int) -> npt.NDArray[np.float64]:
    """A unit vector fixed by the word: nearly orthogonal to every other word's. Read-only:
    the cache hands the same array to every caller."""
    raw = hashlib.shake_256(word.encode()).digest(4 * dim)
    vector = np.frombuffer(raw, dtype="<i4").astype(np.float64)
    vector /= np.linalg.norm(vector) or 1.0
    vector.flags.writeable = False
    return vector


def truncate(vector: list[float], dimensions: int) -> list[float]:
    return _unit(vector[:dimensions])


def _unit(values: tuple[int, ...] | list[float]) -> list[float]:
    """Normalised, at float32 precision: vLLM's vectors are float32 tensors."""
    norm = math.sqrt(math.fsum(v * v for v in values)) or 1.0
    n = len(values)
    return list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *(v / norm for v in values))))


def _inputs(body: Body) -> list[EncodedInput]:
    raw = body.data.get("input")
    if raw is None:
        errors = [
            format_error("missing", f"body.{name}", "Field required", body.data)
            for name in _MISSING_INPUT_FIELDS
        ]
        raise validation_error(*errors, param="body.input")
    if isinstance(raw, str):
        return [(raw, None)]
    if isinstance(raw, list):
        if all(type(t) is int for t in raw):
            return [(None, tuple(raw))] if raw else []
        if all(isinstance(s, str) for s in raw):
            return [(s, None) for s in raw]
        if all(isinstance(p, list) and all(type(t) is int for t in p) for p in raw):
            return [(None, tuple(p)) for p in raw]
    body.fail("string_type", "input", "Input should be a valid string", raw)
    return []


def _encoding_format(value: object) -> str:
    if value in ("float", "base64"):
        return str(value)
    raise Invalid(
        "literal_error",
        "Input should be 'float', 'base64', 'bytes' or 'bytes_only'",
        {"expected": "'float', 'base64', 'bytes' or 'bytes_only'"},
    )


def _check_dimensions(sim: Simulator, dimensions: int | None) -> None:
    config = sim.config
    if dimensions is None:
        return
    if not config.matryoshka:
        raise vllm_validation(
            f"Model {config.model_name!r} does not support Matryoshka embeddings; dimensions "
            f"must be unset (received dimensions={dimensions})."
        )
    if not 1 <= dimensions <= config.embedding_dim:
        raise vllm_validation(
            f"Model {config.model_name!r} only supports dimensions in range "
            f"[1, {config.embedding_dim}], got {dimensions}."
        )


async def serve_embeddings(
    sim: Simulator,
    data: object,
    request_id: str,
    receive: Receive,
    send: Send,
) -> None:
    config = sim.config
    body = Body(data)
    model = body.get("model", to_str, "")
    inputs = _inputs(body)
    encoding = body.get("encoding_format", _encoding_format, "float")
    dimensions = body.get("dimensions", to_int, None)
    priority = body.get("priority", to_int, 0)
    body.check()
    if model and model not in config.served_model_names:
        raise model_not_found(model, None)
    if not inputs:
        raise bad_request("You must pass at least one prompt")
    _check_dimensions(sim, dimensions)
    counts = []
    for text, ids in inputs:
        if text is not None:
            n = tokens.count_text_tokens(text) + SPECIAL_TOKENS
            check_prompt_length(n, config.max_model_len, truncated=True)
        else:
            n = len(ids or ())
            check_prompt_length(n, config.max_model_len, truncated=False)
        counts.append(n)

    plan = sim.faults.plan(streaming=False)
    watch = DisconnectWatch(receive)
    try:
        if await strike_before_work(plan, watch, send):
            return
        # Pooling is one forward pass: a prefill and no decoding, counted as "stop" by vLLM.
        seqs = [
            Sequence(
                prompt_tokens=n,
                target_tokens=1,
                target_reason="stop",
                priority=priority,
                pooling=True,
            )
            for n in counts
        ]

        def abort_all() -> None:
            for s in seqs:
                sim.engine.abort(s)

        watch.on_disconnect(abort_all)
        for s in seqs:
            sim.engine.submit(s)
        for s in seqs:
            await s.wait_finished()
            if s.finish_reason == "abort":
                return
        watch.cancel()
        items = []
        for index, (text, ids) in enumerate(inputs):
            vector = embedding_vector(text, ids, config.embedding_dim)
            if dimensions is not None and dimensions != config.embedding_dim:
                vector = truncate(vector, dimensions)
            items.append(
                {"index": index, "object": "embedding", "embedding": _encode(vector, encoding)}
            )
        prompt_tokens = sum(counts)
        payload: dict[str, Any] = {
            "id": f"embd-{request_id}",
            "object": "list",
            "created": int(time.time()),
            "model": model or config.model_name,
            "data": items,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }
        await send_response(send, 200, orjson.dumps(payload))
    finally:
        watch.cancel()
        if plan.exit_after_response:
            exit_process_soon()


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector

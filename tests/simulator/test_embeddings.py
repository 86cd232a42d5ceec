"""An embedding model (``--kind embedding``): vLLM's pooling server, as OBSERVED.md shows it."""

from __future__ import annotations

import base64
import math
import re
import struct
from typing import Any

import pytest

from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory
from tests.simulator.client import Reply, get, post

EMBEDDINGS = "/v1/embeddings"
MODEL = "minilm"


@pytest.fixture
def sim(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator(
        MODEL, "--kind", "embedding", "--time-scale", "0", "--max-model-len", "256"
    )


def embed(sim: RunningSimulator, **body: Any) -> dict[str, Any]:
    reply = post(sim.base_url, EMBEDDINGS, {"model": MODEL, **body})
    assert reply.status == 200, reply.body
    result: dict[str, Any] = reply.json()
    return result


def error(reply: Reply) -> dict[str, Any]:
    body: dict[str, Any] = reply.json()["error"]
    return body


def test_an_embedding_has_vllms_shape_and_is_a_unit_vector(sim: RunningSimulator) -> None:
    body = embed(sim, input="hello world")
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert re.fullmatch(r"embd-[0-9a-f]{16}", body["id"])
    assert (body["object"], body["model"]) == ("list", MODEL)
    (item,) = body["data"]
    assert list(item) == ["index", "object", "embedding"]
    assert (item["index"], item["object"]) == (0, "embedding")
    vector = item["embedding"]
    assert len(vector) == 384
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-5)
    # "hello world" plus [CLS] and [SEP]
    assert body["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 5,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_equal_inputs_embed_equally_and_different_ones_do_not(sim: RunningSimulator) -> None:
    body = embed(sim, input=["hello world", "goodbye", "hello world"])
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert vectors[0] == vectors[2] != vectors[1]
    assert embed(sim, input="hello world")["data"][0]["embedding"] == vectors[0]


def test_token_ids_and_empty_strings_are_inputs_too(sim: RunningSimulator) -> None:
    assert embed(sim, input=[7592, 2088])["usage"]["prompt_tokens"] == 2
    assert embed(sim, input=[[1, 2, 3], [4]])["usage"]["prompt_tokens"] == 4
    assert embed(sim, input="")["usage"]["prompt_tokens"] == 2


def test_base64_is_the_same_vector_as_little_endian_float32(sim: RunningSimulator) -> None:
    floats = embed(sim, input="hi")["data"][0]["embedding"]
    encoded = embed(sim, input="hi", encoding_format="base64")["data"][0]["embedding"]
    raw = base64.b64decode(encoded)
    assert len(raw) == 384 * 4
    assert list(struct.unpack("<384f", raw)) == floats


def test_dimensions_keeps_the_leading_components_renormalised(sim: RunningSimulator) -> None:
    full = embed(sim, input="hi")["data"][0]["embedding"]
    short = embed(sim, input="hi", dimensions=64)["data"][0]["embedding"]
    assert len(short) == 64
    assert math.isclose(math.fsum(v * v for v in short), 1.0, rel_tol=1e-5)
    scale = short[0] / full[0]
    assert all(
        math.isclose(s, f * scale, rel_tol=1e-4, abs_tol=1e-7)
        for s, f in zip(short, full[:64], strict=True)
    )

    reply = post(sim.base_url, EMBEDDINGS, {"input": "hi", "dimensions": 500})
    assert reply.status == 400
    assert error(reply)["message"] == (
        "Model 'minilm' only supports dimensions in range [1, 384], got 500."
    )


def test_a_model_without_matryoshka_refuses_dimensions(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator(MODEL, "--kind", "embedding", "--no-matryoshka")
    reply = post(sim.base_url, EMBEDDINGS, {"model": MODEL, "input": "hello", "dimensions": 64})
    assert reply.status == 400
    assert error(reply) == {
        "message": "Model 'minilm' does not support Matryoshka embeddings; dimensions must be "
        "unset (received dimensions=64).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_errors_read_as_vllms_pooling_server_words_them(sim: RunningSimulator) -> None:
    unknown = post(sim.base_url, EMBEDDINGS, {"model": "nope", "input": "hello"})
    assert (unknown.status, error(unknown)["param"]) == (404, None)
    assert error(unknown)["message"] == "The model `nope` does not exist."

    empty = post(sim.base_url, EMBEDDINGS, {"model": MODEL, "input": []})
    assert (empty.status, error(empty)["message"]) == (400, "You must pass at least one prompt")

    missing = post(sim.base_url, EMBEDDINGS, {"model": MODEL})
    assert (missing.status, error(missing)["type"], error(missing)["param"]) == (
        400,
        "Bad Request",
        "body.input",
    )
    assert error(missing)["message"].startswith(
        "7 validation errors:\n  {'type': 'missing', 'loc': 'body.input', 'msg': 'Field "
        "required', 'input': '<dict of 1 items>'}\n  {'type': 'missing', 'loc': 'body.messages'"
    )

    too_long = post(sim.base_url, EMBEDDINGS, {"model": MODEL, "input": "hello " * 400})
    assert error(too_long) == {
        "message": "This model's maximum context length is 256 tokens. However, your prompt "
        "contains at least 257 input tokens, which exceeds this limit even without any output "
        "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        "value=257)",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }


def test_embeddings_count_as_finished_with_stop(sim: RunningSimulator) -> None:
    embed(sim, input=["a", "b"])
    metrics = get(sim.base_url, "/metrics").body.decode()
    assert (
        f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{MODEL}"}} 2.0'
        in metrics
    )
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 0.0' in metrics


def cosine(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def test_similarity_follows_the_content_words_texts_share(sim: RunningSimulator) -> None:
    """GIVEN a context sentence WHEN an answer repeats its content words, shares some, or none
    THEN cosine similarity orders them so (docs/simulator.md, "Embeddings")."""
    texts = [
        "The Eiffel Tower was completed in 1889 and stands in Paris.",
        "The Eiffel Tower stands in Paris.",
        "Paris has a tower with many museums near it.",
        "Our savings account pays four percent interest.",
    ]
    context, close, partial, unrelated = (d["embedding"] for d in embed(sim, input=texts)["data"])
    assert cosine(context, close) > 0.7  # eiffel, tower, stand, pari of five content words
    assert 0.2 < cosine(context, partial) < cosine(context, close)
    assert abs(cosine(context, unrelated)) < 0.2


def test_word_order_and_case_do_not_change_the_vector(sim: RunningSimulator) -> None:
    a, b = (d["embedding"] for d in embed(sim, input=["Tower Eiffel", "eiffel TOWERS"])["data"])
    assert cosine(a, b) > 0.9999

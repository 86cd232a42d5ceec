"""The gateway speaks OpenAI's API: the official SDK works unchanged through it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import valkey

from gateway.accounting import USAGE_STREAM
from ops.processes import wait_until
from tests.gateway.conftest import CHAT, EMBED, World


def sdk(world: World, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=world.gateway.base_url + "/v1", api_key=key, max_retries=0)


def test_models_lists_only_what_the_use_case_may_call(world: World) -> None:
    assert sorted(m.id for m in sdk(world, world.alice).models.list()) == [EMBED, CHAT]
    assert [m.id for m in sdk(world, world.bob).models.list()] == [CHAT]


def test_chat_completion_round_trips_through_the_sdk(world: World) -> None:
    reply = sdk(world, world.alice).chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Hello there"}], max_tokens=12
    )
    assert reply.object == "chat.completion"
    assert reply.model == CHAT
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_chat_relays_every_chunk_and_the_usage_chunk(world: World) -> None:
    stream = sdk(world, world.alice).chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Count to five"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert text
    assert finish == ["length"]
    assert len(usage_chunks) == 1
    assert usage_chunks[0].choices == []
    assert usage_chunks[0].usage.completion_tokens == 8


def test_a_stream_without_usage_is_counted_exactly_and_its_client_gets_no_usage_chunk(
    world: World, valkey_client: valkey.Valkey
) -> None:
    """The gateway asks vLLM for the usage chunk on every stream, so its records and token
    windows hold vLLM's counts (before, a streamed prompt counted 0 tokens); a client that
    did not ask for the chunk does not get it (``chunk.choices[0]`` code keeps working)."""
    client = sdk(world, world.alice)
    # Any: the SDK's overloads cannot follow a request built from a table.
    create: dict[str, Any] = {
        "chat": client.chat.completions.create,
        "completion": client.completions.create,
    }
    prompt: dict[str, dict[str, Any]] = {
        "chat": {"messages": [{"role": "user", "content": "Count to five, slowly and clearly"}]},
        "completion": {"prompt": "Once upon a time"},
    }

    def stream(kind: str, **extra: Any) -> list[Any]:
        chunks = create[kind](model=CHAT, max_tokens=6, stream=True, **prompt[kind], **extra)
        return list(chunks)

    asked: dict[str, int] = {}
    for kind in ("chat", "completion"):
        usage = [c.usage for c in stream(kind, stream_options={"include_usage": True}) if c.usage]
        assert len(usage) == 1
        asked[kind] = usage[0].prompt_tokens

    variants: list[tuple[str, str, dict[str, object] | None]] = [
        ("plain", "chat", None),
        ("declined", "chat", {"include_usage": False}),
        ("empty", "chat", {}),
        ("completion", "completion", None),
    ]
    for name, kind, options in variants:
        chunks = stream(
            kind,
            extra_headers={"X-Request-Id": f"no-usage-{name}"},
            extra_body={} if options is None else {"stream_options": options},
        )
        assert chunks, name
        assert all(c.choices for c in chunks), name
        assert all(c.usage is None for c in chunks), name
        finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        assert finish == ["length"], name

    def records() -> dict[str, dict[bytes, bytes]]:
        return {
            fields[b"request_id"].decode(): fields
            for _, fields in valkey_client.xrange(USAGE_STREAM)
        }

    assert wait_until(lambda: all(f"no-usage-{name}" in records() for name, *_ in variants))
    found = records()
    for name, kind, _ in variants:
        record = found[f"no-usage-{name}"]
        assert int(record[b"prompt_tokens"]) == asked[kind], name
        assert int(record[b"completion_tokens"]) == 6, name

    # On the wire: the events a client without stream_options gets end in [DONE], and
    # none of them is the usage event.
    with httpx.stream(
        "POST",
        world.gateway.base_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {world.alice}"},
        json={"model": CHAT, **prompt["chat"], "max_tokens": 6, "stream": True},
    ) as response:
        raw = response.read()
    assert response.status_code == 200
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' not in raw


def test_completions_and_embeddings_are_forwarded(world: World) -> None:
    client = sdk(world, world.alice)
    completion = client.completions.create(model=CHAT, prompt="Once upon a time", max_tokens=5)
    assert completion.choices[0].text
    embedding = client.embeddings.create(model=EMBED, input=["alpha", "beta"])
    assert len(embedding.data) == 2
    assert len(embedding.data[0].embedding) > 0


def test_every_response_carries_a_request_id_and_keeps_a_sane_given_one(world: World) -> None:
    headers = {"Authorization": f"Bearer {world.alice}"}
    minted = httpx.get(world.gateway.base_url + "/v1/models", headers=headers)
    assert len(minted.headers["x-request-id"]) == 32
    kept = httpx.get(
        world.gateway.base_url + "/v1/models", headers={**headers, "X-Request-Id": "trace-42"}
    )
    assert kept.headers["x-request-id"] == "trace-42"
    for unsafe in ("spaces and;semicolons", "x" * 129):
        replaced = httpx.get(
            world.gateway.base_url + "/v1/models", headers={**headers, "X-Request-Id": unsafe}
        )
        assert len(replaced.headers["x-request-id"]) == 32


def served_per_replica(world: World) -> list[float]:
    served = []
    for replica in world.chat_replicas:
        metrics = httpx.get(replica + "/metrics").text
        served.append(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("vllm:request_success_total{")
            )
        )
    return served


def test_concurrent_requests_spread_over_both_replicas(world: World) -> None:
    client = sdk(world, world.alice)

    def one(i: int) -> None:
        client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=30
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(16)))
    served = served_per_replica(world)
    assert sum(served) == 16
    assert all(count >= 3 for count in served), served  # least-in-flight balances them


def test_a_shared_prompt_prefix_stays_on_one_replica(world: World) -> None:
    # Prefix-cache affinity: a use case's long system prompt is prefilled once, on one replica.
    system = "You are the claims assistant of ACME Insurance. " * 40
    client = sdk(world, world.alice)
    for i in range(6):
        client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}],
            max_tokens=1,
        )
    assert sorted(served_per_replica(world)) == [0, 6]


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_model_name_is_rewritten_to_the_served_name(
    valkey_client, start_simulator, start_gateway, stream: bool
) -> None:
    from testkit.policy import PolicyBuilder

    replica = start_simulator("served-internal-name", "--time-scale", "0")
    policy = PolicyBuilder().model(
        "public-name", [replica.base_url], served_name="served-internal-name"
    )
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="public-name",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=2,
                stream=True,
            )
        )
        assert chunks
    else:
        reply = client.chat.completions.create(
            model="public-name", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        assert reply.choices[0].message.content


def test_a_model_with_two_deployments_sends_each_replica_its_own_served_name(
    valkey_client: valkey.Valkey, start_simulator: Any, start_gateway: Any
) -> None:
    """GIVEN one public model deployed twice, under a different served name on each
    deployment's replica, WHEN requests spread over both replicas, THEN each replica gets the
    name it serves (a replica asked for the other deployment's name answers vLLM's 404).

    The first replica answers slowly, so it still holds a request when the next is placed:
    the least-in-flight choice must then pick the second (without it, fast answers can all
    land on the first replica, which wins ties)."""
    from testkit.policy import PolicyBuilder

    first = start_simulator(
        "llama-h100", "--time-scale", "0.01", "--fault-slow-first-byte-ms", "1000"
    )
    second = start_simulator("llama-h200", "--time-scale", "0.01")
    replicas = [first.base_url, second.base_url]
    policy = PolicyBuilder().model(
        "llama",
        replicas,
        served_name="llama-h100",
        deployments=[("llama-h100", [first.base_url]), ("llama-h200", [second.base_url])],
    )
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()

    def one(i: int) -> int:
        body = {
            "model": "llama",
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 20,
            "stream": i % 2 == 1,
        }
        return httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(one, range(16)))
    assert statuses == [200] * 16
    served = [
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(url + "/metrics").text.splitlines()
            if line.startswith("vllm:request_success_total{")
        )
        for url in replicas
    ]
    assert sum(served) == 16
    assert all(count >= 1 for count in served), served  # both deployments were asked


def test_a_reused_request_id_comes_back_to_its_client_while_vllm_gets_unique_ids(
    world: World, valkey_client: valkey.Valkey
) -> None:
    """GIVEN three concurrent calls with the same ``X-Request-Id``, THEN vLLM (which builds
    its request id and the completion's ``id`` from the header it receives) sees three
    different ids, while the client's id comes back in the response header and is the one
    in the usage records."""

    def one(i: int) -> httpx.Response:
        return httpx.post(
            world.gateway.base_url + "/v1/chat/completions",
            json={
                "model": CHAT,
                "messages": [{"role": "user", "content": f"q{i}"}],
                "max_tokens": 20,
            },
            headers={"Authorization": f"Bearer {world.alice}", "X-Request-Id": "trace-42"},
        )

    with ThreadPoolExecutor(max_workers=3) as pool:
        responses = list(pool.map(one, range(3)))
    assert [r.status_code for r in responses] == [200] * 3
    assert [r.headers["x-request-id"] for r in responses] == ["trace-42"] * 3
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 3, ids
    assert "chatcmpl-trace-42" not in ids  # vLLM got a unique id, not the client's

    def records() -> list[str]:
        return [fields[b"request_id"].decode() for _, fields in valkey_client.xrange(USAGE_STREAM)]

    assert wait_until(lambda: len(records()) == 3)
    assert records() == ["trace-42"] * 3


def test_a_speech_model_with_two_deployments_sends_each_replica_its_own_served_name(
    valkey_client: valkey.Valkey, start_simulator: Any, start_gateway: Any
) -> None:
    """The same for transcriptions: the multipart form is renamed for the granted replica."""
    from testkit.policy import PolicyBuilder

    names = ["whisper-h100", "whisper-h200"]
    sims = [start_simulator(n, "--kind", "transcription", "--time-scale", "1") for n in names]
    policy = PolicyBuilder().model(
        "whisper",
        [s.base_url for s in sims],
        capabilities=("transcription",),
        served_name=names[0],
        deployments=[(n, [s.base_url]) for n, s in zip(names, sims, strict=True)],
    )
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()

    def one(i: int) -> int:
        return httpx.post(
            gateway.base_url + "/v1/audio/transcriptions",
            # 10 s of audio at 128 kbit/s: a transcription long enough that the six overlap
            # even on a loaded machine (one at a time, each would find both replicas idle
            # and take the first).
            files={"file": (f"call-{i}.wav", b"RIFF" + bytes(160_000 + i), "audio/wav")},
            data={"model": "whisper"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).status_code

    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = list(pool.map(one, range(6)))
    assert statuses == [200] * 6
    served = [
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(s.base_url + "/metrics").text.splitlines()
            if line.startswith("vllm:request_success_total{")
        )
        for s in sims
    ]
    assert sum(served) == 6
    assert all(count >= 1 for count in served), served

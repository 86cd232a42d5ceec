"""The playground, end to end: the portal's async view calls a real gateway (in front of a
real simulator and guardrail service) as the use case, and relays its stream or its refusal.

Personas: alice is a developer of tenant acme, bob of tenant globex, olivia a governance
officer, audrey an auditor. acme's use cases: chatbot (no limits), tight (one request a
minute), guarded (blocks the word "secret" on requests), redacting (redacts every word the
simulator says from its answers).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from html import unescape
from typing import Any

import pytest
from django.test import AsyncClient, Client
from django.urls import reverse

from governance.choices import UseCaseStatus
from governance.models import ApiKey, AuditEvent, GuardrailSelection, UseCase
from governance.roles import Role
from governance.snapshot import snapshot_publish
from simulator.tokens import VOCABULARY
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.guardrail_service import GuardrailServiceFactory, start_guardrail_service
from tests.conftest import GatewayFactory, SimulatorFactory

__all__ = ["start_guardrail_service"]

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "llama-play"

Events = list[tuple[str, dict[str, object]]]


@dataclass
class World:
    chatbot: UseCase
    tight: UseCase
    guarded: UseCase
    redacting: UseCase
    alice: Any
    bob: Any
    olivia: Any
    audrey: Any
    gateway_url: str


@pytest.fixture
def people() -> dict[str, object]:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    return {
        "acme": acme,
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
    }


@pytest.fixture
def world(
    settings,
    valkey_url: str,
    valkey_client,
    people,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_guardrail_service: GuardrailServiceFactory,
) -> World:
    settings.VALKEY_URL = valkey_url
    # Real decode timing (8 ms a token): an answer takes long enough to see it stream.
    replica = start_simulator(MODEL)
    model = make_model(MODEL, replicas=[replica.base_url])
    acme = people["acme"]
    chatbot = make_use_case(acme, "chatbot", models=(model,))
    tight = make_use_case(acme, "tight", models=(model,), requests_per_minute=1)
    guarded = make_use_case(acme, "guarded", models=(model,))
    GuardrailSelection.objects.create(
        use_case=guarded,
        guardrail="words",
        side="request",
        action="block",
        config={"words": ["secret"]},
        position=0,
    )
    # Every word the simulator says is redacted from its answers: a known redaction to see.
    redacting = make_use_case(acme, "redacting", models=(model,))
    GuardrailSelection.objects.create(
        use_case=redacting,
        guardrail="words",
        side="response",
        action="redact",
        config={"words": list(VOCABULARY)},
        position=0,
    )
    snapshot_publish()
    service = start_guardrail_service()
    gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url)
    settings.PLAYGROUND_GATEWAY_URL = gateway.base_url
    settings.GATEWAY_PUBLIC_URL = gateway.base_url
    return World(
        chatbot=chatbot,
        tight=tight,
        guarded=guarded,
        redacting=redacting,
        gateway_url=gateway.base_url,
        **{name: people[name] for name in ("alice", "bob", "olivia", "audrey")},
    )


def _parse(body: bytes) -> Events:
    events: Events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def _play(
    user: Any,
    use_case: UseCase,
    message: str = "Hello there",
    model: str = MODEL,
    max_tokens: int = 8,
    arrivals: list[float] | None = None,
) -> tuple[int, str, Events]:
    """POST to the playground through Django's ASGI handler; the status, content type and
    the events of the stream (none when the portal itself refused)."""

    async def go() -> tuple[int, str, Events]:
        client = AsyncClient()
        await client.aforce_login(user)
        response = await client.post(
            reverse("portal:playground_chat", args=[use_case.pk]),
            {"model": model, "message": message, "max_tokens": max_tokens},
        )
        if not response.streaming:
            return response.status_code, response["Content-Type"], []
        stream = response.streaming_content  # type: ignore[attr-defined]
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if arrivals is not None:
                arrivals.append(time.monotonic())
        body = b"".join(chunks)
        return response.status_code, response["Content-Type"], _parse(body)

    return asyncio.run(go())


# --- through the real gateway -------------------------------------------------------------
def test_the_answer_streams_from_the_gateway_and_the_call_is_audited(world: World) -> None:
    status, content_type, events = _play(world.alice, world.chatbot)
    assert status == 200
    assert content_type == "text/event-stream"
    names = [name for name, _ in events]
    assert names[0] == "start"
    assert names[-1] == "done"
    deltas = [data["text"] for name, data in events if name == "delta"]
    assert len(deltas) > 1  # streamed, chunk by chunk
    assert "".join(str(d) for d in deltas).strip()
    done = events[-1][1]
    assert done["finish"] == "length"
    assert done["usage"]["completion_tokens"] == 8  # type: ignore[index]
    assert str(done["request_id"])
    event = AuditEvent.objects.get(action="playground.chat")
    assert event.actor == "alice"
    assert event.object_id == str(world.chatbot.pk)
    assert event.after == {"model": MODEL, "max_tokens": 8}
    assert "Hello there" not in json.dumps(event.after)


def test_the_first_words_arrive_while_the_model_is_still_answering(world: World) -> None:
    """The relay streams: it does not collect the answer first (60 tokens at 8 ms each)."""
    arrivals: list[float] = []
    status, _, events = _play(world.alice, world.chatbot, max_tokens=60, arrivals=arrivals)
    assert status == 200
    assert events[-1][0] == "done"
    assert events[-1][1]["usage"]["completion_tokens"] == 60  # type: ignore[index]
    assert len(arrivals) > 10
    assert arrivals[-1] - arrivals[1] > 0.25  # the first delta came well before the end


def test_an_officer_may_use_the_playground_too(world: World) -> None:
    status, _, events = _play(world.olivia, world.chatbot)
    assert status == 200
    assert events[-1][0] == "done"


def test_a_rate_limited_use_case_shows_the_429_and_its_retry_after(world: World) -> None:
    assert _play(world.alice, world.tight)[2][-1][0] == "done"
    status, _, events = _play(world.alice, world.tight)
    assert status == 200  # the portal answered; the gateway's refusal is in the stream
    [(name, refusal)] = events
    assert name == "refusal"
    assert refusal["status"] == 429
    assert int(str(refusal["retry_after"])) >= 1
    assert "limit" in str(refusal["message"]).lower()


def test_a_guardrail_block_is_shown_with_the_guardrails_name(world: World) -> None:
    status, _, events = _play(world.alice, world.guarded, message="tell me the secret")
    assert status == 200
    [(name, refusal)] = events
    assert name == "refusal"
    assert refusal["status"] == 400
    assert refusal["code"] == "guardrail_blocked"
    assert refusal["message"] == "The request was blocked by the 'words' guardrail (WORD)."
    # The same use case answers a harmless message.
    assert _play(world.alice, world.guarded, message="tell me a story")[2][-1][0] == "done"


def test_a_redacted_answer_is_shown_redacted(world: World) -> None:
    status, _, events = _play(world.alice, world.redacting, message="Tell me a story")
    assert status == 200
    assert events[-1][0] == "done"
    text = "".join(str(data["text"]) for name, data in events if name == "delta")
    assert "<WORD>" in text
    assert not set(text.replace("<WORD>", " ").split()) & set(VOCABULARY)


def test_the_python_snippet_runs_against_the_gateway_with_the_revealed_key(
    world: World,
) -> None:
    alice, olivia = Client(), Client()
    alice.force_login(world.alice)
    olivia.force_login(world.olivia)
    alice.post(
        reverse("portal:key_request", args=[world.chatbot.pk]),
        {"name": "checkout", "reason": "The checkout service answers questions."},
    )
    key = ApiKey.objects.get(name="checkout")
    olivia.post(reverse("portal:key_decide", args=[key.pk]), {"decision": "approve"})
    html = unescape(alice.post(reverse("portal:key_reveal", args=[key.pk])).content.decode())
    start = html.index('id="secret-key">') + len('id="secret-key">')
    secret = html[start : html.index("</code>", start)]
    start = html.index('<code id="snippet-python">') + len('<code id="snippet-python">')
    snippet = html[start : html.index("</code>", start)]
    snapshot_publish()  # what on_commit does in production (this test's commits are real)
    ran = subprocess.run(
        [sys.executable, "-c", snippet],
        env={**os.environ, "OPENAI_API_KEY": secret},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()  # the model's answer, printed


# --- refusals by the portal (no gateway needed: nothing reaches it) -----------------------
@pytest.fixture
def offline(people) -> World:
    """acme's chatbot with no gateway running: a refusal must not need one."""
    chatbot = make_use_case(people["acme"], "chatbot", models=(make_model(MODEL),))
    return World(
        chatbot=chatbot,
        tight=chatbot,
        guarded=chatbot,
        redacting=chatbot,
        gateway_url="",
        **{name: people[name] for name in ("alice", "bob", "olivia", "audrey")},
    )


def test_another_tenants_developer_is_refused(offline: World) -> None:
    assert _play(offline.bob, offline.chatbot)[0] == 404
    assert not AuditEvent.objects.filter(action="playground.chat").exists()


def test_an_auditor_reads_but_cannot_play(offline: World) -> None:
    assert _play(offline.audrey, offline.chatbot)[0] == 403
    assert not AuditEvent.objects.filter(action="playground.chat").exists()


def test_a_model_the_use_case_may_not_call_is_refused(offline: World) -> None:
    status, content_type, _ = _play(offline.alice, offline.chatbot, model="gpt-4o")
    assert status == 400
    assert content_type.startswith("text/plain")


def test_a_suspended_use_case_has_no_playground(offline: World) -> None:
    UseCase.objects.filter(pk=offline.chatbot.pk).update(status=UseCaseStatus.SUSPENDED)
    assert _play(offline.alice, offline.chatbot)[0] == 409


def test_a_gateway_that_cannot_be_reached_is_said_so(offline: World, settings) -> None:
    from ops.processes import free_port

    settings.PLAYGROUND_GATEWAY_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens
    status, _, events = _play(offline.alice, offline.chatbot)
    assert status == 200
    [(name, error)] = events
    assert name == "error"
    assert "could not be reached" in str(error["message"])

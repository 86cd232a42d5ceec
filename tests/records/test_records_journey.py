"""Records end to end, every part real: a gateway process captures, a Celery worker persists
into SeaweedFS, and an auditor downloads what the client was answered, byte for byte.

GIVEN three use cases of one tenant — records ``full``, ``metadata`` and ``none`` — behind a
real gateway, simulator, Valkey, Celery worker and SeaweedFS,
WHEN a client chats with each (plain and streamed),
THEN the auditor's export holds the full use case's request and response exactly as
forwarded and answered, the metadata use case's records without content, and nothing of the
``none`` use case; and the export is itself in the audit trail.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

import httpx
import orjson
import pytest
from rest_framework.test import APIClient

from governance.models import AuditEvent
from governance.roles import Role
from governance.snapshot import snapshot_publish
from ops.processes import wait_until
from records.models import InteractionRecord
from records.objects import field_bytes
from runtime.valkey_urls import for_kombu
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.records_store import RecordsStore
from tests.conftest import GatewayFactory, SimulatorFactory
from tests.records.conftest import RecordsWorkerFactory

pytestmark = pytest.mark.django_db(transaction=True)
KEYS = f"journey:{base64.b64encode(os.urandom(32)).decode()}"
QUESTION = "Summarise the claim of policy 4471 for the adjuster."


@pytest.fixture
def world(
    settings: Any,
    valkey_url: str,
    valkey_client: Any,
    records_store: RecordsStore,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> dict[str, Any]:
    settings.VALKEY_URL = valkey_url
    settings.RECORDS_KEYS = KEYS
    replica = start_simulator("llama", "--time-scale", "0")
    acme = make_tenant("acme")
    llama = make_model("llama", replicas=[replica.base_url])
    secrets = {}
    for policy in ("full", "metadata", "none"):
        use_case = make_use_case(acme, f"{policy}-bot", models=(llama,), record_policy=policy)
        secrets[policy] = make_key(use_case)[1]
    snapshot_publish()
    return {"gateway": start_gateway().base_url, "secrets": secrets}


def chat(world: dict[str, Any], policy: str, *, stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {"model": "llama", "messages": [{"role": "user", "content": QUESTION}]}
    if stream:
        body["stream"] = True
    answer = httpx.post(
        world["gateway"] + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {world['secrets'][policy]}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer


def test_an_auditor_downloads_what_the_client_was_answered_byte_for_byte(
    world: dict[str, Any], valkey_url: str, start_records_worker: RecordsWorkerFactory
) -> None:
    plain = chat(world, "full")
    streamed = chat(world, "full", stream=True)
    metadata_only = chat(world, "metadata")
    unrecorded = chat(world, "none")
    assert b"data: [DONE]" in streamed.content
    record_ids = {
        name: answer.headers["x-switchyard-record-id"]
        for name, answer in {
            "plain": plain,
            "streamed": streamed,
            "metadata": metadata_only,
            "none": unrecorded,
        }.items()
    }
    assert len(set(record_ids.values())) == 4

    # Persisted by a real worker, through the Valkey broker, as beat would ask.
    from config.celery import app
    from records.tasks import persist_records, persist_usage

    worker = start_records_worker(KEYS)
    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))

    def persisted() -> bool:
        persist_usage.delay()
        persist_records.delay()
        stored = InteractionRecord.objects.filter(content=InteractionRecord.Content.STORED)
        return stored.count() == 2 and InteractionRecord.objects.count() == 3

    assert wait_until(persisted, timeout=60, interval=1.0), worker.log_tail()

    auditor = APIClient()
    auditor.force_authenticate(make_user("audrey", Role.AUDITOR))
    export = auditor.get("/api/records/export/", {"format": "jsonl", "tenant": "acme"})
    assert export.status_code == 200
    body = b"".join(export.streaming_content)  # type: ignore[attr-defined]
    rows = {row["record_id"]: row for row in map(orjson.loads, body.splitlines())}

    assert set(rows) == {record_ids["plain"], record_ids["streamed"], record_ids["metadata"]}
    full_plain, full_streamed = rows[record_ids["plain"]], rows[record_ids["streamed"]]
    assert field_bytes(full_plain, "response") == plain.content
    assert field_bytes(full_streamed, "response") == streamed.content
    assert full_streamed["streamed"] is True
    forwarded = orjson.loads(field_bytes(full_plain, "request"))
    assert forwarded["messages"] == [{"role": "user", "content": QUESTION}]
    assert rows[record_ids["metadata"]]["content"] == "none"
    assert "response" not in rows[record_ids["metadata"]]
    assert rows[record_ids["metadata"]]["status"] == 200

    # The streamed answer reads back as one message, equal to the text the client got.
    transcript = auditor.get(f"/api/records/{record_ids['streamed']}/").json()
    deltas = [
        orjson.loads(line[len(b"data: ") :])
        for line in streamed.content.splitlines()
        if line.startswith(b"data: {")
    ]
    text = "".join(d["choices"][0]["delta"].get("content") or "" for d in deltas if d["choices"])
    assert transcript["assembled"]["choices"][0]["text"] == text

    # The download is itself in the audit trail, with what was sent.
    exported = AuditEvent.objects.get(action="records.exported")
    assert exported.actor == "audrey"
    assert exported.after is not None
    assert exported.after["records"] == 3
    assert exported.after["sha256"] == hashlib.sha256(body).hexdigest()
    assert AuditEvent.objects.filter(action="records.viewed").count() == 1

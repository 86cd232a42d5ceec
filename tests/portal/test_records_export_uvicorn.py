"""A records export through the real web process: uvicorn serving config.asgi, its own
database file, content in the test's SeaweedFS bucket.

GIVEN 30,001 records (one with stored content) and an auditor signed in
WHEN she starts an export and reads its first bytes
THEN the export has not finished (no audit event yet): the server streams, it did not build
the file first; when she goes away the export is audited as cut short, and a full download
is audited with its record count and the SHA-256 of exactly the bytes she received.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from ops.processes import PYTHON, REPO_ROOT, wait_until
from testkit.factories import PASSWORD
from testkit.records import chat_response
from testkit.records_store import RecordsStore
from testkit.web_process import running_web

RECORDS = 30_000

SEED = f"""
from governance.roles import Role
from records.models import InteractionRecord
from testkit.factories import make_tenant, make_use_case, make_user
from testkit.records import chat_request, chat_response, make_record, store_content

chatbot = make_use_case(make_tenant("acme"), "chatbot", record_policy="full")
template = make_record(chatbot)
fields = [f.attname for f in InteractionRecord._meta.concrete_fields if f.attname != "id"]
rows = []
for number in range({RECORDS} - 1):
    row = InteractionRecord(**{{name: getattr(template, name) for name in fields}})
    row.record_id = f"{{number:032x}}"
    rows.append(row)
InteractionRecord.objects.bulk_create(rows, batch_size=2000)
kept = make_record(chatbot, minutes=60)
store_content([(kept, chat_request("hello there"), chat_response("general kenobi"))])
make_user("audrey", Role.AUDITOR)
"""


@pytest.fixture
def web(tmp_path: Path, records_store: RecordsStore) -> Iterator[str]:
    env = {
        **records_store.env,
        "SWITCHYARD_RUN_DIR": str(tmp_path),
        "SWITCHYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'web.sqlite3'}",
    }
    for argv in (["migrate", "-v0"], ["shell", "-c", SEED]):
        done = subprocess.run(
            [PYTHON, "manage.py", *argv],
            cwd=REPO_ROOT,
            env={**_environ(), **env},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    with running_web(env) as url:
        yield url


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}


def _signed_in(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=60)
    form = client.get("/accounts/login/")
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert match is not None
    answer = client.post(
        "/accounts/login/",
        data={"username": "audrey", "password": PASSWORD, "csrfmiddlewaretoken": match[1]},
    )
    assert answer.status_code == 302, answer.text
    return client


def _exports(client: httpx.Client) -> list[dict[str, Any]]:
    answer = client.get("/api/audit-events/", params={"action": "records.exported"})
    assert answer.status_code == 200, answer.text
    return [event["after"] for event in answer.json()["results"]]


def test_an_export_streams_from_the_web_process_and_is_audited(web: str) -> None:
    audrey, watcher = _signed_in(web), _signed_in(web)

    with audrey.stream("GET", "/records/export/", params={"format": "jsonl"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/jsonl"
        chunks = response.iter_raw()
        first = next(chunks)
        assert first.startswith(b'{"record_id":')
        # 14 MB are on their way; had the server built the file first, it would be audited.
        assert _exports(watcher) == []
    # She went away after the first bytes.
    assert wait_until(lambda: len(_exports(watcher)) == 1, timeout=20)
    (cut,) = _exports(watcher)
    assert cut["complete"] is False
    assert 0 < cut["records"] < RECORDS

    with audrey.stream("GET", "/records/export/", params={"format": "jsonl"}) as response:
        digest, size, lines = hashlib.sha256(), 0, 0
        for chunk in response.iter_raw():
            digest.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
    assert lines == RECORDS + 1
    newest = orjson.loads(first.split(b"\n", 1)[0])
    assert newest["response"] == chat_response("general kenobi").decode()
    assert wait_until(lambda: len(_exports(watcher)) == 2, timeout=20)
    full = _exports(watcher)[-1]  # in sequence order
    # Each export's end names its start, audited before the first byte (with the filter).
    started = watcher.get("/api/audit-events/", params={"action": "records.export_started"})
    assert started.status_code == 200, started.text
    assert started.json()["results"][-1]["sequence"] == full.pop("started")
    assert full == {
        "filter": {},
        "format": "jsonl",
        "records": RECORDS + 1,
        "sha256": digest.hexdigest(),
        "complete": True,
    }
    assert size > 10_000_000

"""The "My work" page: a person's files and async tasks, the tasks submitted through a real
gateway process and run by a real batcher, on real Valkey and the vLLM simulator.

Personas: alice is a developer of acme (use case acme/search), bob a developer of globex
(globex/ledger), olivia a governance officer. Each sees the tasks and files of the use cases
she or he may see, and no one else's.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from html import unescape

import pytest
import valkey
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from openai import OpenAI

from gateway.async_tasks.client import AsyncTaskClient
from governance.choices import FileKind, FileState
from governance.models import FileRegistration, Model, UseCase
from governance.roles import Role
from ops.processes import free_port
from portal.developer.work_tasks import SCAN_CALLS, tasks_page
from testkit.async_tasks import submit
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.policy import PolicyBuilder
from tests.conftest import BatcherFactory, GatewayFactory, SimulatorFactory

pytestmark = pytest.mark.django_db

EMBED = "embed"
URL = "/my-work/"
TASKS_URL = "/my-work/tasks/"


@dataclass
class World:
    search: UseCase
    ledger: UseCase
    alice_tasks: AsyncTaskClient
    bob_tasks: AsyncTaskClient
    alice: Client
    bob: Client
    olivia: Client
    start_batcher: BatcherFactory


def _client_for(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def _tasks(base_url: str, key: str) -> AsyncTaskClient:
    return AsyncTaskClient(
        OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30)
    )


@pytest.fixture
def world(
    settings: object,
    valkey_url: str,
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_batcher: BatcherFactory,
) -> World:
    settings.VALKEY_URL = valkey_url  # type: ignore[attr-defined]
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder().model(EMBED, [embed.base_url], capabilities=("embeddings",))
    alice_key = policy.key(tenant="acme", use_case="search")
    bob_key = policy.key(tenant="globex", use_case="ledger")
    policy.publish(valkey_client)
    acme, globex = make_tenant("acme"), make_tenant("globex")
    # The same ids the published snapshot gives the use cases: the tasks carry them.
    search = make_use_case(acme, "search", pk=policy.use_case_id(alice_key))
    ledger = make_use_case(globex, "ledger", pk=policy.use_case_id(bob_key))
    gateway = start_gateway()
    return World(
        search=search,
        ledger=ledger,
        alice_tasks=_tasks(gateway.base_url, alice_key),
        bob_tasks=_tasks(gateway.base_url, bob_key),
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
        start_batcher=start_batcher,
    )


def _html(client: Client, url: str = URL) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content.decode()
    return unescape(response.content.decode())


def _task_rows(html: str) -> dict[str, str]:
    """Task id → its status, as the tasks table shows them."""
    return dict(re.findall(r'<tr data-task="([^"]+)" data-status="([^"]+)">', html))


def _refreshing(html: str) -> bool:
    wrapper = re.search(r'<div id="work-tasks"([^>]*)>', html)
    assert wrapper, "no tasks table wrapper on the page"
    refreshing = 'hx-trigger="every' in wrapper[1]
    assert refreshing == ('data-refreshing="true"' in wrapper[1])
    return refreshing


def _file(use_case: UseCase, filename: str) -> FileRegistration:
    model = Model.objects.filter(public_id=EMBED).first() or make_model(EMBED)
    now = timezone.now()
    return FileRegistration.objects.create(
        use_case=use_case,
        registered_by="alice",
        kind=FileKind.BATCH,
        filename=filename,
        model=model,
        declared_bytes=1000,
        deadline=now + dt.timedelta(hours=4),
        state=FileState.RUNNING,
        progress=0.4,
        estimated_tokens=1000,
        promised_by=now + dt.timedelta(hours=3),
    )


def test_alice_follows_her_tasks_from_queued_to_done_and_reads_the_result(world: World) -> None:
    """GIVEN alice's two tasks and bob's one, submitted through the gateway before any
    batcher runs
    WHEN alice opens My work, then a batcher starts and runs them
    THEN she sees her two tasks queued, the table refreshing itself; then done, with a
    result link answering the API's JSON, and the refresh stopped; bob's task never shows."""
    first = world.alice_tasks.submit("embeddings", {"model": EMBED, "input": "claim one"})
    deadline = int(timezone.now().timestamp()) + 3600
    second = world.alice_tasks.submit(
        "embeddings", {"model": EMBED, "input": "claim two", "deadline": deadline}
    )
    bobs = world.bob_tasks.submit("embeddings", {"model": EMBED, "input": "ledger entry"})

    html = _html(world.alice)
    assert _task_rows(html) == {first.id: "queued", second.id: "queued"}
    assert _refreshing(html)
    row = re.search(rf'<tr data-task="{second.id}".*?</tr>', html, re.S)
    assert row
    assert '<small class="muted">/v1/embeddings</small>' in row[0]
    assert f'<code class="nowrap">{EMBED}</code>' in row[0]
    detail = reverse("portal:use_case_detail", args=[world.search.pk])
    assert f'<a href="{detail}"><code>acme/search</code></a>' in row[0]
    when = dt.datetime.fromtimestamp(deadline, tz=dt.UTC)
    assert f'title="{when:%Y-%m-%d %H:%M:%S} UTC">{when:%m-%d %H:%M}</time>' in row[0]

    world.start_batcher()
    world.alice_tasks.wait(first.id, timeout=30)
    world.alice_tasks.wait(second.id, timeout=30)
    world.bob_tasks.wait(bobs.id, timeout=30)

    partial = _html(world.alice, TASKS_URL)
    assert _task_rows(partial) == {first.id: "done", second.id: "done"}
    assert not _refreshing(partial)
    result_url = reverse("portal:my_work_task", args=[first.id])
    assert f'<a href="{result_url}">Result (JSON)</a>' in partial

    answer = world.alice.get(result_url)
    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/json"
    document = json.loads(answer.content)
    api = world.alice_tasks.get(first.id).raw
    assert document == api  # the gateway's own GET /v1/tasks/{id}, field for field
    assert document["result"]["data"][0]["embedding"]


def test_bob_sees_only_his_task_and_cannot_read_alices_while_olivia_sees_both(
    world: World,
) -> None:
    """GIVEN a done task of alice's use case and one of bob's
    WHEN bob and olivia open My work and bob asks for alice's task by id
    THEN bob sees only his own and gets a 404 for alice's; olivia sees both."""
    world.start_batcher()
    alices = world.alice_tasks.submit("embeddings", {"model": EMBED, "input": "alice"})
    bobs = world.bob_tasks.submit("embeddings", {"model": EMBED, "input": "bob"})
    world.alice_tasks.wait(alices.id, timeout=30)
    world.bob_tasks.wait(bobs.id, timeout=30)

    assert _task_rows(_html(world.bob)) == {bobs.id: "done"}
    assert world.bob.get(reverse("portal:my_work_task", args=[alices.id])).status_code == 404
    assert world.bob.get(reverse("portal:my_work_task", args=["task_nope"])).status_code == 404
    assert _task_rows(_html(world.olivia)) == {alices.id: "done", bobs.id: "done"}
    assert world.olivia.get(reverse("portal:my_work_task", args=[alices.id])).status_code == 200


def test_files_are_scoped_and_linked_to_their_pages(world: World) -> None:
    """GIVEN a batch file of alice's use case and one of bob's
    WHEN each opens My work
    THEN each sees their own file with its state, progress, deadline and a link to the
    file's page, and not the other's."""
    alices = _file(world.search, "claims.jsonl")
    bobs = _file(world.ledger, "ledger.jsonl")

    html = _html(world.alice)
    files = re.search(r'<table id="work-files">(.*?)</table>', html, re.S)
    assert files, "no files table"
    assert (
        f'<a href="{reverse("portal:file_detail", args=[alices.pk])}">claims.jsonl</a>' in files[1]
    )
    assert "ledger.jsonl" not in html
    row = re.search(rf'<tr data-file="{alices.pk}">(.*?)</tr>', files[1], re.S)
    assert row
    assert '<span class="status status-running">' in row[1]
    assert "40%" in row[1]
    assert alices.deadline is not None
    assert alices.deadline.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M") in row[1]
    assert "claims.jsonl" not in _html(world.bob)
    assert bobs.filename in _html(world.bob)


def test_with_valkey_down_the_page_still_shows_files_and_says_tasks_are_unavailable(
    world: World, settings: object
) -> None:
    """GIVEN alice's file in the database and the task store unreachable
    WHEN alice opens My work, its tasks table and a task's result
    THEN the page answers 200 with her file and a notice that tasks are unavailable (no
    traceback, no refresh loop); the result answers 503 in the API's error shape."""
    _file(world.search, "claims.jsonl")
    settings.VALKEY_URL = f"valkey://127.0.0.1:{free_port()}/0"  # type: ignore[attr-defined]

    html = _html(world.alice)
    assert "claims.jsonl" in html
    notice = re.search(r'<p class="callout" role="status" id="tasks-unavailable">(.*?)</p>', html)
    assert notice
    assert "Async tasks are unavailable" in notice[1]
    assert "Traceback" not in html
    assert not _refreshing(html)
    assert "tasks-unavailable" in _html(world.alice, TASKS_URL)
    answer = world.alice.get(reverse("portal:my_work_task", args=["task_abc"]))
    assert answer.status_code == 503
    assert json.loads(answer.content)["error"]["code"] == "tasks_unavailable"


def test_a_person_without_a_role_finds_no_such_page(world: World) -> None:
    """GIVEN someone signed in with no role WHEN they open My work THEN 404."""
    nobody = _client_for(make_user("nobody"))
    assert nobody.get(URL).status_code == 404
    assert nobody.get(TASKS_URL).status_code == 404


def test_tasks_page_through_the_store_with_the_scan_cursor_and_miss_none(
    valkey_client: valkey.Valkey,
) -> None:
    """GIVEN 40 tasks of use case 7 and 40 of use case 8 in the task store
    WHEN use case 7's tasks are read a few at a time, following the cursor
    THEN every one of them is read exactly once, none of use case 8's, and no page makes more
    than the bounded number of SCAN calls."""
    mine = {
        submit(
            valkey_client,
            model=EMBED,
            endpoint="/v1/embeddings",
            body={"input": str(i)},
            use_case_id=7,
        )
        for i in range(40)
    }
    for i in range(40):
        submit(
            valkey_client,
            model=EMBED,
            endpoint="/v1/embeddings",
            body={"input": str(i)},
            use_case_id=8,
        )

    seen: list[str] = []
    cursor, pages = 0, 0
    while True:
        page = tasks_page(valkey_client, use_case_ids=[7], cursor=cursor, rows=5, count=10)
        assert page.examined <= SCAN_CALLS
        assert {row.use_case_id for row in page.rows} <= {7}
        seen.extend(row.id for row in page.rows)
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted(mine)
    assert pages > 1

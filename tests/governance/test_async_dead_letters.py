"""Dead-lettered async tasks through the API and the service: officers list, replay and
discard them; auditors and developers look; replays are atomic and audited.

Personas: olivia is a governance officer, root an admin, audrey an auditor, alice a developer
of tenant acme, bob a developer of tenant globex, mallory has an account and no role. The dead
letters are written as the batcher writes them (testkit/dead_letters.py), on real Valkey.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import valkey
from django.test import Client

from gateway.async_tasks import layout
from governance.audit import Actor
from governance.dead_letters import dead_letter_replay, dead_letters_list, replay_lua_source
from governance.errors import NotFound
from governance.models import AuditEvent, UseCase
from governance.roles import Role
from ops.processes import free_port
from testkit.dead_letters import (
    RESULT_TTL_S,
    dead_letter,
    entry_of,
    now_ms,
    pttl,
    status_of,
)
from testkit.factories import make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

LIST = "/api/async/dead-letters/"
QUEUE_TTL_S = 1800


def replay_url(entry_id: str) -> str:
    return f"{LIST}{entry_id}/replay/"


def discard_url(entry_id: str) -> str:
    return f"{LIST}{entry_id}/discard/"


@dataclass
class World:
    acme_search: UseCase
    globex_search: UseCase
    olivia: Client
    root: Client
    audrey: Client
    alice: Client
    bob: Client
    mallory: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(live_valkey_settings, valkey_client: valkey.Valkey) -> World:
    live_valkey_settings.ASYNC_QUEUE_TTL_SECONDS = QUEUE_TTL_S
    acme, globex = make_tenant("acme"), make_tenant("globex")
    return World(
        acme_search=make_use_case(acme, "search", async_result_ttl_seconds=900),
        globex_search=make_use_case(globex, "search"),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
        root=_client_for(make_user("root", Role.ADMIN)),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        mallory=_client_for(make_user("mallory")),
    )


def _tasks(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [letter["task_id"] for letter in response.json()["results"]]


# --- listing ---------------------------------------------------------------------------------
def test_olivia_lists_every_tenants_dead_letters_newest_first_with_what_failed(
    world: World, valkey_client: valkey.Valkey
) -> None:
    failed_ms = 1_764_240_000_000  # 2025-11-27 10:40:00 UTC
    _, older, _ = dead_letter(valkey_client, world.acme_search, failed_ms=failed_ms)
    entry_id, newer, fields = dead_letter(
        valkey_client, world.globex_search, model="classify", message="replica gone"
    )

    response = world.olivia.get(LIST)
    assert _tasks(response) == [newer, older]
    body = response.json()
    assert body["next"] is None
    first, second = body["results"]
    assert first == {
        "entry_id": entry_id,
        "task_id": newer,
        "endpoint": "/v1/embeddings",
        "model": "classify",
        "use_case_id": world.globex_search.pk,
        "tenant": "globex",
        "priority_class": "batch",
        "error": "replica gone",
        "attempts": layout.MAX_ATTEMPTS,
        "failed_at": first["failed_at"],
        "created_at": first["created_at"],
        "stream": fields["stream"],
    }
    assert "body" not in first  # a task's input is never shown to officers
    assert second["failed_at"] == "2025-11-27T10:40:00Z"
    assert second["error"] == "upstream answered 503 three times"


def test_the_list_pages_by_entry_id_newest_first(
    world: World, valkey_client: valkey.Valkey
) -> None:
    tasks = [dead_letter(valkey_client, world.acme_search)[1] for _ in range(5)]
    newest_first = tasks[::-1]

    first = world.olivia.get(LIST, {"count": 2})
    assert _tasks(first) == newest_first[:2]
    following = first.json()["next"]
    assert following.startswith("http://testserver/api/async/dead-letters/?count=2&before=")
    second = world.olivia.get(following)
    assert _tasks(second) == newest_first[2:4]
    third = world.olivia.get(second.json()["next"])
    assert _tasks(third) == newest_first[4:]
    assert third.json()["next"] is None


def test_a_bad_page_query_is_a_400_naming_the_field(world: World) -> None:
    too_big = f"{2**64}-0"  # the id's shape, but no stream id can be this large
    for query, field in (
        ({"before": "yesterday"}, "before"),
        ({"before": too_big}, "before"),
        ({"count": 0}, "count"),
        ({"count": 201}, "count"),
    ):
        response = world.olivia.get(LIST, query)
        assert response.status_code == 400, query
        assert field in response.json()


def test_nothing_is_older_than_the_first_possible_id(
    world: World, valkey_client: valkey.Valkey
) -> None:
    dead_letter(valkey_client, world.acme_search)
    response = world.olivia.get(LIST, {"before": "0-0"})
    assert _tasks(response) == []
    assert response.json()["next"] is None


def test_developers_see_their_own_tenants_dead_letters_only_and_auditors_all(
    world: World, valkey_client: valkey.Valkey
) -> None:
    acme_tasks = [dead_letter(valkey_client, world.acme_search)[1] for _ in range(3)]
    globex = dead_letter(valkey_client, world.globex_search)[1]
    acme_tasks.append(dead_letter(valkey_client, world.acme_search)[1])

    assert _tasks(world.alice.get(LIST)) == acme_tasks[::-1]
    assert _tasks(world.bob.get(LIST)) == [globex]
    assert _tasks(world.audrey.get(LIST)) == [acme_tasks[3], globex, *acme_tasks[2::-1]]
    # Paging skips what a developer may not see and still fills the page.
    page = world.alice.get(LIST, {"count": 2})
    assert _tasks(page) == acme_tasks[:1:-1]
    assert _tasks(world.alice.get(page.json()["next"])) == acme_tasks[1::-1]

    assert world.mallory.get(LIST).status_code == 403
    assert Client().get(LIST).status_code in (401, 403)


# --- replay ----------------------------------------------------------------------------------
def test_olivia_replays_a_dead_letter_into_its_stream_queued_with_attempts_reset(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    task = layout.task(task_id)
    before_ms = now_ms()

    response = world.olivia.post(replay_url(entry_id))

    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["task_id"] == task_id
    assert answer["dead_letter"]["entry_id"] == entry_id
    # Back in the partition stream it came from, with every field of the original entry and a
    # fresh queue lifetime (the old one may have passed while it sat dead-lettered).
    requeued = entry_of(valkey_client, fields["stream"], answer["stream_entry_id"])
    assert valkey_client.xlen(fields["stream"]) == 1
    assert set(requeued) == set(layout.ENTRY_FIELDS)
    expected = {name: fields[name] for name in layout.ENTRY_FIELDS if name != "expires_ms"}
    assert {k: v for k, v in requeued.items() if k != "expires_ms"} == expected
    assert before_ms + QUEUE_TTL_S * 1000 <= int(requeued["expires_ms"])
    assert int(requeued["expires_ms"]) <= now_ms() + QUEUE_TTL_S * 1000
    # The task reads as queued again, without its old failure, and lives as a queued task.
    state = {k.decode(): v.decode() for k, v in valkey_client.hgetall(task).items()}
    assert state["status"] == "queued"
    assert state["attempts"] == "0"
    assert state["expires_ms"] == requeued["expires_ms"]
    assert not {"dead_lettered", "error", "finished_ms", "status_code"} & set(state)
    assert RESULT_TTL_S * 1000 < pttl(valkey_client, task) <= QUEUE_TTL_S * 1000
    assert valkey_client.get(layout.depth("embed")) == b"1"
    assert valkey_client.xlen(layout.dead_letters()) == 0

    event = AuditEvent.objects.get(action="async.dead_letter_replay")
    after = event.after
    assert after is not None
    assert event.actor == "olivia"
    assert event.tenant_slug == "acme"
    assert event.tenant_id == world.acme_search.tenant_id
    assert after["task"] == task_id
    assert after["dead_letter"] == entry_id
    assert after["stream_entry"] == answer["stream_entry_id"]
    assert after["error"] == "upstream answered 503 three times"


def test_a_second_replay_is_a_404_and_queues_nothing_twice(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, _, fields = dead_letter(valkey_client, world.acme_search)
    assert world.olivia.post(replay_url(entry_id)).status_code == 200

    again = world.root.post(replay_url(entry_id))

    assert again.status_code == 404
    assert "replayed, discarded or never was" in again.json()["detail"]
    assert valkey_client.xlen(fields["stream"]) == 1
    assert valkey_client.get(layout.depth("embed")) == b"1"
    assert AuditEvent.objects.filter(action="async.dead_letter_replay").count() == 1


def test_the_replay_itself_is_atomic_when_the_dead_letter_goes_between_read_and_replay(
    world: World, valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN two replays that both read the same dead letter, WHEN the first puts it back and
    the second's script then runs, THEN the script finds it gone and adds nothing (NotFound)."""
    entry_id, _, fields = dead_letter(valkey_client, world.acme_search)
    platform = Actor.system("test")

    class RacingClient(valkey.Valkey):
        """Replays the dead letter itself right after the service has read it."""

        raced = False

        def xrange(self, *args, **kwargs):
            found = super().xrange(*args, **kwargs)
            if not RacingClient.raced:
                RacingClient.raced = True
                dead_letter_replay(actor=platform, entry_id=entry_id, client=valkey_client)
            return found

    racing = RacingClient.from_url(valkey_url)
    try:
        with pytest.raises(NotFound, match="replayed or discarded meanwhile"):
            dead_letter_replay(actor=platform, entry_id=entry_id, client=racing)
    finally:
        racing.close()
    assert RacingClient.raced
    assert valkey_client.xlen(fields["stream"]) == 1
    assert valkey_client.get(layout.depth("embed")) == b"1"


def test_a_task_that_ran_meanwhile_is_not_replayed_409(
    world: World, valkey_client: valkey.Valkey
) -> None:
    """At-least-once: a reclaimed copy of the task may have succeeded after all."""
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    valkey_client.hset(layout.task(task_id), "status", "done")

    response = world.olivia.post(replay_url(entry_id))

    assert response.status_code == 409
    assert f"Task {task_id} is done, not failed" in response.json()["detail"]
    assert valkey_client.xlen(fields["stream"]) == 0
    assert valkey_client.xlen(layout.dead_letters()) == 1  # still there, to discard
    assert not AuditEvent.objects.filter(action="async.dead_letter_replay").exists()


def test_a_task_past_its_deadline_is_not_replayed_409(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, fields = dead_letter(
        valkey_client, world.acme_search, deadline_ms=now_ms() - 1000
    )

    response = world.olivia.post(replay_url(entry_id))

    assert response.status_code == 409
    assert "deadline has passed" in response.json()["detail"]
    assert valkey_client.xlen(fields["stream"]) == 0
    assert status_of(valkey_client, task_id) == "failed"


def test_a_task_whose_hash_expired_is_rebuilt_queued_with_its_use_cases_result_lifetime(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    valkey_client.delete(layout.task(task_id))

    response = world.olivia.post(replay_url(entry_id))

    assert response.status_code == 200, response.content
    state = {k.decode(): v.decode() for k, v in valkey_client.hgetall(layout.task(task_id)).items()}
    requeued = entry_of(valkey_client, fields["stream"], response.json()["stream_entry_id"])
    assert state == {
        "status": "queued",
        "use_case_id": str(world.acme_search.pk),
        "tenant": "acme",
        "model": "embed",
        "endpoint": "/v1/embeddings",
        "created_ms": fields["created_ms"],
        "deadline_ms": "0",
        "expires_ms": requeued["expires_ms"],
        "attempts": "0",
        "result_ttl_s": "900",
    }
    assert 0 < pttl(valkey_client, layout.task(task_id)) <= QUEUE_TTL_S * 1000


def test_who_may_replay_officers_and_admins_others_are_refused_or_see_nothing(
    world: World, valkey_client: valkey.Valkey
) -> None:
    acme_entry, _, acme_fields = dead_letter(valkey_client, world.acme_search)
    globex_entry, _, _ = dead_letter(valkey_client, world.globex_search)

    # alice sees acme's dead letter but may not decide about it; globex's does not exist for her.
    assert world.alice.post(replay_url(acme_entry)).status_code == 403
    assert world.alice.post(discard_url(acme_entry)).status_code == 403
    assert world.alice.post(replay_url(globex_entry)).status_code == 404
    assert world.audrey.post(replay_url(acme_entry)).status_code == 403
    assert world.mallory.post(replay_url(acme_entry)).status_code == 403
    assert valkey_client.xlen(layout.dead_letters()) == 2
    assert valkey_client.xlen(acme_fields["stream"]) == 0

    assert world.root.post(replay_url(globex_entry)).status_code == 200
    event = AuditEvent.objects.get(action="async.dead_letter_replay")
    assert (event.actor, event.tenant_slug) == ("root", "globex")


def test_an_unknown_or_malformed_id_is_a_404(world: World, valkey_client: valkey.Valkey) -> None:
    dead_letter(valkey_client, world.acme_search)
    missing = world.olivia.post(replay_url("1-0"))
    assert missing.status_code == 404
    assert "No dead letter 1-0" in missing.json()["detail"]
    assert world.olivia.post(f"{LIST}not-an-id/replay/").status_code == 404
    too_big = world.olivia.post(replay_url(f"{2**64}-0"))  # no Valkey error, just not found
    assert too_big.status_code == 404
    assert "No dead letter" in too_big.json()["detail"]
    assert world.olivia.post(discard_url("1-0")).status_code == 404


# --- discard ---------------------------------------------------------------------------------
def test_olivia_discards_a_dead_letter_for_good_and_the_task_stays_failed(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    kept, _, _ = dead_letter(valkey_client, world.acme_search)

    response = world.olivia.post(discard_url(entry_id))

    assert response.status_code == 200, response.content
    assert response.json()["task_id"] == task_id
    assert [letter["entry_id"] for letter in world.olivia.get(LIST).json()["results"]] == [kept]
    assert valkey_client.xlen(fields["stream"]) == 0
    assert status_of(valkey_client, task_id) == "failed"
    assert valkey_client.get(layout.depth("embed")) is None
    event = AuditEvent.objects.get(action="async.dead_letter_discard")
    assert event.after is not None
    assert (event.actor, event.tenant_slug, event.after["task"]) == ("olivia", "acme", task_id)

    assert world.olivia.post(discard_url(entry_id)).status_code == 404
    assert world.olivia.post(replay_url(entry_id)).status_code == 404
    assert AuditEvent.objects.filter(action="async.dead_letter_discard").count() == 1


# --- Valkey down -----------------------------------------------------------------------------
def test_valkey_out_of_reach_is_a_503_and_changes_nothing(world: World, settings) -> None:
    settings.VALKEY_URL = f"valkey://127.0.0.1:{free_port()}/0"
    for response in (
        world.olivia.get(LIST),
        world.olivia.post(replay_url("1-0")),
        world.olivia.post(discard_url("1-0")),
    ):
        assert response.status_code == 503
        assert "cannot be reached" in response.json()["detail"]
    assert not AuditEvent.objects.filter(action__startswith="async.").exists()


# --- the service, for other callers (CLI, Celery) --------------------------------------------
def test_the_platform_lists_every_dead_letter_and_a_bad_cursor_is_refused(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, _ = dead_letter(valkey_client, world.globex_search)
    page = dead_letters_list(user=None, client=valkey_client)
    assert [letter.task_id for letter in page.letters] == [task_id]
    assert page.letters[0].entry_id == entry_id
    assert page.next_before is None
    with pytest.raises(ValueError, match="before must be"):
        dead_letters_list(user=None, before="latest", client=valkey_client)
    with pytest.raises(ValueError, match="count must be"):
        dead_letters_list(user=None, count=1000, client=valkey_client)


def test_a_dead_letter_without_its_stream_is_not_replayed_409(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, _ = dead_letter(valkey_client, world.acme_search, stream="")

    response = world.olivia.post(replay_url(entry_id))

    assert response.status_code == 409
    assert "does not name its stream" in response.json()["detail"]
    assert status_of(valkey_client, task_id) == "failed"
    assert valkey_client.xlen(layout.dead_letters()) == 1


def test_the_replay_script_refuses_a_stream_other_than_the_entrys(
    world: World, valkey_client: valkey.Valkey
) -> None:
    """The script declares every key it writes; it writes only the stream the entry names."""
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    script = valkey_client.register_script(replay_lua_source())
    elsewhere = layout.stream("embed", 99)

    answer = script(
        keys=[layout.dead_letters(), elsewhere, layout.task(task_id), layout.depth("embed")],
        args=[entry_id, now_ms(), 60_000, 600, *layout.ENTRY_FIELDS],
    )

    assert answer == [b"conflict", b"stream"]
    assert valkey_client.exists(elsewhere, fields["stream"]) == 0
    assert valkey_client.xlen(layout.dead_letters()) == 1

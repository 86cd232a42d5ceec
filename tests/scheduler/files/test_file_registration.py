"""POST /api/files/ and friends: an instant feasibility answer, for the use case's developers,
officers and its own API keys; refused work stores nothing; cancel releases the promise.

Real Valkey (the ledger and the measured throughput), real sessions and real API keys.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import valkey
from django.utils import timezone
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration, PriorityClass, SlaClass
from governance.roles import Role
from governance.services.api_keys import api_key_revoke
from governance.sla_windows import DAYS, open_intervals, parse_windows, zone
from ops.processes import free_port
from scheduler.files import feasibility
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

RATE = 100.0  # the default tokens/s of an unmeasured model; half of it is batch's


@pytest.fixture
def world(live_valkey_settings: Any) -> dict[str, Any]:
    live_valkey_settings.BATCH_DEFAULT_TOKENS_PER_SECOND = RATE
    live_valkey_settings.BATCH_CAPACITY_SHARE = 0.5
    live_valkey_settings.FILE_TOKENS_PER_AUDIO_SECOND = 25.0
    # The arithmetic below plans from now; the beat's start lag:
    # tests/scheduler/files/test_feasibility
    live_valkey_settings.FILE_JOBS_START_LAG_SECONDS = 0.0
    acme, globex = make_tenant("acme"), make_tenant("globex")
    whisper = make_model("whisper", capabilities=["transcription"])
    llama = make_model("llama", capabilities=["chat"])
    make_model("other", capabilities=["chat"])
    transcribe = make_use_case(acme, "transcribe", models=(whisper, llama))
    elsewhere = make_use_case(globex, "elsewhere", models=(whisper,))
    batch = PriorityClass.objects.get(name="batch")
    hourly = SlaClass.objects.create(
        use_case=transcribe,
        name="hourly",
        turnaround_seconds=3600,
        priority_class=batch,
        kinds=["audio", "text"],
        max_file_bytes=10**9,
    )
    nightly = SlaClass.objects.create(
        use_case=transcribe,
        name="nightly",
        windows=[
            {
                "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                "start": "20:00",
                "end": "06:00",
            }
        ],
        priority_class=batch,
        kinds=["audio"],
    )
    key, secret = make_key(transcribe)
    _, other_secret = make_key(elsewhere)
    return {
        "use_case": transcribe,
        "elsewhere": elsewhere,
        "hourly": hourly,
        "nightly": nightly,
        "key": key,
        "secret": secret,
        "other_secret": other_secret,
        "users": {
            "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
            "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
            "olivia": make_user("olivia", Role.OFFICER),
            "audrey": make_user("audrey", Role.AUDITOR),
            "mallory": make_user("mallory"),
        },
    }


def as_user(world: dict[str, Any], name: str) -> APIClient:
    client = APIClient()
    client.force_login(world["users"][name])
    return client


def as_key(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def audio(world: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {
        "use_case": world["use_case"].pk,
        "kind": "audio",
        "filename": "call-0001.wav",
        "model": "whisper",
        "declared_bytes": 5_000_000,
        "declared_seconds": 60,
        "sla_class": "hourly",
        **changes,
    }


def ledger(client: valkey.Valkey, model: str = "whisper") -> set[str]:
    return {k.decode() for k in client.hkeys(feasibility.ledger_key(model))}


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_developer_registers_a_file_and_gets_a_promise_at_once(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    before = timezone.now()
    response = as_user(world, "alice").post("/api/files/", audio(world), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == FileState.REGISTERED
    assert body["estimated_tokens"] == 1500  # 60 s × 25 tokens
    promised = when(body["promised_by"])
    assert before + timedelta(hours=1) <= promised <= timezone.now() + timedelta(hours=1)
    # 1500 tokens at half of 100 tokens/s: 30 s from now.
    eta = when(body["eta"])
    assert before + timedelta(seconds=29) <= eta <= timezone.now() + timedelta(seconds=31)
    assert body["capacity"] == {"tokens_per_second": 50.0, "measured": False}
    assert body["registered_by"] == "alice"

    row = FileRegistration.objects.get(pk=body["id"])
    assert row.sla_class == world["hourly"]
    assert ledger(valkey_client) == {str(row.pk)}
    event = AuditEvent.objects.get(action="file.register")
    assert event.actor == "alice"
    assert event.object_id == str(row.pk)
    assert event.after is not None
    assert event.after["estimated_tokens"] == 1500


def test_work_that_cannot_be_done_in_time_is_refused_with_the_earliest_possible(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    # 10 000 s of audio = 250 000 tokens; at 50 tokens/s that is 5000 s, past the hour.
    response = as_user(world, "alice").post(
        "/api/files/", audio(world, declared_seconds=10_000), format="json"
    )
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "infeasible"
    assert "whisper" in body["error"]
    # Quoted with the margin a client needs to ask again (feasibility.QUOTE_MARGIN_SECONDS).
    earliest = when(body["earliest_possible"]) - timedelta(seconds=feasibility.QUOTE_MARGIN_SECONDS)
    assert timezone.now() + timedelta(seconds=4990) <= earliest
    assert earliest <= timezone.now() + timedelta(seconds=5010)
    assert not FileRegistration.objects.exists()
    assert not AuditEvent.objects.filter(action="file.register").exists()
    assert ledger(valkey_client) == set()

    # The earliest possible, asked for as a deadline, is accepted.
    retry = audio(
        world, declared_seconds=10_000, sla_class=None, deadline=body["earliest_possible"]
    )
    response = as_user(world, "alice").post("/api/files/", retry, format="json")
    assert response.status_code == 201, response.content


def test_promises_add_up_until_the_model_is_full(world: dict[str, Any]) -> None:
    alice = as_user(world, "alice")
    # 3600 s × 50 tokens/s = 180 000 tokens an hour: two files of 2400 s of audio (60 000
    # tokens each) fit, a third does not.
    for _ in range(3):
        ok = alice.post("/api/files/", audio(world, declared_seconds=2400), format="json")
        assert ok.status_code == 201, ok.content
    full = alice.post("/api/files/", audio(world, declared_seconds=2400), format="json")
    assert full.status_code == 409


def test_a_measured_capacity_is_used_and_said_to_be(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    valkey_client.hset(
        feasibility.throughput_key("whisper"),
        mapping={"capacity": "1000", "at_ms": str(int(timezone.now().timestamp() * 1000))},
    )
    response = as_user(world, "alice").post("/api/files/", audio(world), format="json")
    assert response.json()["capacity"] == {"tokens_per_second": 500.0, "measured": True}


def test_a_window_only_sla_promises_the_end_of_the_next_window(world: dict[str, Any]) -> None:
    response = as_user(world, "alice").post(
        "/api/files/", audio(world, sla_class="nightly"), format="json"
    )
    assert response.status_code == 201, response.content
    nights = parse_windows(world["nightly"].windows)
    spans = list(itertools.islice(open_intervals(nights, zone("UTC"), datetime.now(UTC)), 2))
    promised = when(response.json()["promised_by"])
    # The window open now, unless too little of it is left for 30 s of work: the next one.
    expected = spans[0][1] if spans[0][1] - spans[0][0] >= timedelta(seconds=31) else spans[1][1]
    assert promised == expected
    assert when(response.json()["eta"]) <= promised


def test_work_that_does_not_fit_what_is_left_of_a_window_gets_the_next_one(
    world: dict[str, Any],
) -> None:
    """GIVEN a daily window that opens in a minute or two and lasts two (6000 tokens at 50/s)
    WHEN 2500 tokens are promised in it THEN 4000 more do not fit what is left of it, and
    are promised for the end of tomorrow's."""
    opens = (timezone.now() + timedelta(minutes=2)).replace(second=0, microsecond=0)
    closes = opens + timedelta(minutes=2)
    short = SlaClass.objects.create(
        use_case=world["use_case"],
        name="short",
        windows=[{"days": list(DAYS), "start": f"{opens:%H:%M}", "end": f"{closes:%H:%M}"}],
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["audio"],
    )
    fits = as_user(world, "alice").post(
        "/api/files/", audio(world, sla_class=short.name, declared_seconds=100), format="json"
    )
    assert fits.status_code == 201, fits.content
    assert when(fits.json()["promised_by"]) == closes
    too_big = as_user(world, "alice").post(
        "/api/files/", audio(world, sla_class=short.name, declared_seconds=160), format="json"
    )
    assert too_big.status_code == 201, too_big.content
    assert when(too_big.json()["promised_by"]) == closes + timedelta(days=1)
    assert FileRegistration.objects.get(pk=too_big.json()["id"]).promised_by == closes + timedelta(
        days=1
    )


def test_not_before_delays_the_work(world: dict[str, Any]) -> None:
    start = timezone.now() + timedelta(hours=2)
    deadline = (start + timedelta(hours=1)).isoformat()
    body = audio(world, sla_class=None, deadline=deadline, not_before=start.isoformat())
    response = as_user(world, "alice").post("/api/files/", body, format="json")
    assert response.status_code == 201, response.content
    eta = when(response.json()["eta"])
    assert start + timedelta(seconds=29) <= eta <= start + timedelta(seconds=31)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"deadline": "2099-01-01T00:00:00Z"}, "sla_class"),  # both
        ({"sla_class": None}, "sla_class"),  # neither
        ({"sla_class": None, "deadline": "2001-01-01T00:00:00Z"}, "deadline"),
        ({"kind": "pdf", "declared_seconds": None, "declared_pages": 3}, "kind"),
        ({"declared_bytes": 10**9 + 1}, "declared_bytes"),
        ({"model": "other"}, "model"),  # not allowed for the use case
        ({"model": "llama"}, "model"),  # allowed, but it cannot transcribe
        ({"model": "nope"}, "model"),
        ({"sla_class": "weekly"}, "sla_class"),
        ({"declared_pages": 3}, "declared_pages"),  # seconds and pages
        ({"kind": "video"}, "kind"),
        ({"declared_bytes": 0}, "declared_bytes"),
    ],
)
def test_a_bad_registration_is_a_400_that_says_why(
    world: dict[str, Any], valkey_client: valkey.Valkey, changes: dict[str, Any], field: str
) -> None:
    response = as_user(world, "alice").post("/api/files/", audio(world, **changes), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not FileRegistration.objects.exists()
    assert ledger(valkey_client) == set()


def test_roles_and_tenants(world: dict[str, Any]) -> None:
    body = audio(world)
    assert as_user(world, "olivia").post("/api/files/", body, format="json").status_code == 201
    assert as_user(world, "audrey").post("/api/files/", body, format="json").status_code == 403
    assert as_user(world, "mallory").post("/api/files/", body, format="json").status_code == 403
    # bob develops for globex: acme's use case does not exist for him
    assert as_user(world, "bob").post("/api/files/", body, format="json").status_code == 404
    assert APIClient().post("/api/files/", body, format="json").status_code == 401

    file_id = FileRegistration.objects.get().pk
    assert as_user(world, "audrey").get(f"/api/files/{file_id}/").status_code == 200
    assert as_user(world, "alice").get("/api/files/").json()["count"] == 1
    assert as_user(world, "bob").get(f"/api/files/{file_id}/").status_code == 404
    assert as_user(world, "bob").get("/api/files/").json()["count"] == 0
    assert as_user(world, "mallory").get("/api/files/").status_code == 403
    assert as_user(world, "audrey").post(f"/api/files/{file_id}/cancel/").status_code == 403
    assert as_user(world, "bob").post(f"/api/files/{file_id}/cancel/").status_code == 404


def test_an_api_key_registers_for_its_own_use_case_only(world: dict[str, Any]) -> None:
    key_client = as_key(world["secret"])
    body = audio(world)
    del body["use_case"]  # the key's own
    response = key_client.post("/api/files/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["registered_by"] == f"key:{world['key'].prefix}"
    assert FileRegistration.objects.get().api_key == world["key"]
    assert AuditEvent.objects.get(action="file.register").actor == f"key:{world['key'].prefix}"
    assert key_client.get("/api/files/").json()["count"] == 1

    # Another use case's key sees nothing of it and may not register for it
    other = as_key(world["other_secret"])
    assert other.get("/api/files/").json()["count"] == 0
    file_id = FileRegistration.objects.get().pk
    assert other.get(f"/api/files/{file_id}/").status_code == 404
    assert other.post("/api/files/", audio(world), format="json").status_code == 403
    # Keys open /api/files/ only
    assert key_client.get("/api/use-cases/").status_code in (401, 403)


def test_an_unknown_or_revoked_key_is_a_401(world: dict[str, Any]) -> None:
    body = audio(world)
    assert as_key("sk-sy-not-a-key").post("/api/files/", body, format="json").status_code == 401
    api_key_revoke(actor=Actor.system("tests"), key=world["key"])
    response = as_key(world["secret"]).post("/api/files/", body, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_cancel_releases_the_promise_and_is_audited(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    alice = as_user(world, "alice")
    file_id = alice.post("/api/files/", audio(world), format="json").json()["id"]
    assert ledger(valkey_client) == {str(file_id)}
    response = alice.post(f"/api/files/{file_id}/cancel/", {"reason": "wrong file"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == FileState.CANCELLED
    assert ledger(valkey_client) == set()
    event = AuditEvent.objects.get(action="fileregistration.cancelled")
    assert event.actor == "alice"
    assert event.after is not None
    assert event.after["reason"] == "wrong file"
    assert alice.post(f"/api/files/{file_id}/cancel/").status_code == 409
    # A key of the use case may cancel its registrations too
    key_client = as_key(world["secret"])
    second = key_client.post("/api/files/", audio(world), format="json").json()["id"]
    assert key_client.post(f"/api/files/{second}/cancel/").status_code == 200


def test_only_approved_use_cases_take_files(world: dict[str, Any]) -> None:
    world["use_case"].status = "suspended"
    world["use_case"].save()
    response = as_user(world, "alice").post("/api/files/", audio(world), format="json")
    assert response.status_code == 409
    assert "suspended" in response.json()["detail"]


def test_without_valkey_the_answer_is_a_503_and_nothing_is_stored(
    world: dict[str, Any], settings: Any
) -> None:
    settings.VALKEY_URL = f"valkey://127.0.0.1:{free_port()}/0"  # nothing listens
    response = as_user(world, "alice").post("/api/files/", audio(world), format="json")
    assert response.status_code == 503
    assert not FileRegistration.objects.exists()

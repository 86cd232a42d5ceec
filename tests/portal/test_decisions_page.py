"""The portal's admission-decisions page: "why was request X refused at 14:02?".

Personas: alice is a developer of tenant acme, bob a developer of tenant globex, audrey an
auditor, mallory has an account and no role. The decisions reach the database the way the
gateway's do: entries on the ``sy:decisions`` stream, drained by the usage persister, which
also writes the hash-chained audit summary of each minute's refusals.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
import valkey
from django.test import Client
from django.urls import reverse

from gateway.accounting import DECISION_FIELDS, DECISIONS_STREAM
from governance.models import UseCase
from governance.roles import Role
from records.models import AdmissionDecision
from records.usage import REFUSAL_ACTION, usage_persist
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

URL = "/admission-decisions/"
AT_1402 = datetime(2025, 3, 4, 14, 2, 15, tzinfo=UTC)
TPM = "rate_limit:tenant acme tokens per minute"


@dataclass
class World:
    acme_chatbot: UseCase
    globex_search: UseCase
    alice: Client
    bob: Client
    audrey: Client
    mallory: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _gateway_decides(client: valkey.Valkey, at: datetime, **values: object) -> None:
    """One entry as the gateway writes it to the decisions stream."""
    fields: dict[str, object] = dict.fromkeys(DECISION_FIELDS, "")
    fields.update(
        at_ms=int(at.timestamp() * 1000),
        decision="rejected",
        tenant="acme",
        key_id=11,
        model="llama-3.1-8b",
        wait_ms=0,
        policy_version=3,
    )
    fields.update(values)
    client.xadd(DECISIONS_STREAM, {k: str(v) for k, v in fields.items()})


@pytest.fixture
def world(valkey_client: valkey.Valkey) -> World:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama-3.1-8b")
    acme_chatbot = make_use_case(acme, "chatbot", models=(llama,))
    globex_search = make_use_case(globex, "search", models=(llama,))
    acme_id, globex_id = acme_chatbot.pk, globex_search.pk
    # acme: refused at 14:02:15 and 14:05, one queue wait; globex: shed at the queue deadline
    _gateway_decides(valkey_client, AT_1402, request_id="req-1402", use_case_id=acme_id, reason=TPM)
    _gateway_decides(
        valkey_client,
        AT_1402 + timedelta(minutes=3),
        request_id="req-1405",
        use_case_id=acme_id,
        reason="max_concurrent_exceeded",
        policy_version=4,
    )
    _gateway_decides(
        valkey_client,
        AT_1402 + timedelta(seconds=20),
        request_id="req-wait",
        use_case_id=acme_id,
        decision="queued",
        reason="interactive",
        wait_ms=1250,
    )
    _gateway_decides(
        valkey_client,
        AT_1402 + timedelta(seconds=30),
        request_id="req-globex",
        tenant="globex",
        use_case_id=globex_id,
        decision="shed",
        reason="queue_timeout",
        wait_ms=800,
    )
    usage_persist(client=valkey_client, consumer="portal-tests")
    assert AdmissionDecision.objects.count() == 4
    return World(
        acme_chatbot=acme_chatbot,
        globex_search=globex_search,
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        mallory=_client_for(make_user("mallory")),
    )


def _page(client: Client, **query: str | int) -> str:
    response = client.get(URL, query)
    assert response.status_code == 200, response.content.decode()
    return unescape(response.content.decode())


def _request_ids(html: str) -> set[str]:
    ids = {"req-1402", "req-1405", "req-wait", "req-globex"}
    return {request_id for request_id in ids if f"<code>{request_id}</code>" in html}


# --- the auditor's question ------------------------------------------------------------------
def test_audrey_finds_a_refused_request_by_id_with_its_reason_version_and_summary(
    world: World,
) -> None:
    assert reverse("portal:admission_decisions") == URL
    row = AdmissionDecision.objects.get(request_id="req-1402")
    assert row.audit_sequence is not None

    html = _page(world.audrey, request_id="req-1402")
    assert _request_ids(html) == {"req-1402"}
    assert "2025-03-04 14:02:15" in html
    assert "rate limit: tenant acme tokens per minute" in html
    assert "<td>acme</td>" in html
    assert '<td class="num">3</td>' in html  # the policy version
    summary = f"/api/audit-events/{row.audit_sequence}/"
    assert f'<a href="{summary}">#{row.audit_sequence}</a>' in html
    chatbot = reverse("portal:use_case_detail", args=[world.acme_chatbot.pk])
    assert f'<a href="{chatbot}"><code>acme/chatbot</code></a>' in html

    # The link leads to the hash-chained summary of that minute's refusals.
    event = world.audrey.get(summary)
    assert event.status_code == 200
    assert event.json()["action"] == REFUSAL_ACTION
    assert "req-1402" in event.json()["after"]["request_ids"]


def test_audrey_sees_every_tenant_newest_first_with_waits_and_reasons(world: World) -> None:
    html = _page(world.audrey)
    assert _request_ids(html) == {"req-1402", "req-1405", "req-wait", "req-globex"}
    order = [html.index(f"<code>{rid}</code>") for rid in ("req-1405", "req-globex", "req-1402")]
    assert order == sorted(order)
    assert "max concurrent requests exceeded" in html
    assert "queue deadline passed" in html
    assert "priority class: interactive" in html
    assert "1.2 s" in html  # the queue wait
    assert "800 ms" in html


def test_the_time_range_and_decision_narrow_the_search_in_utc(world: World, settings) -> None:
    settings.TIME_ZONE = "Europe/Berlin"  # the form still reads UTC, the page still shows UTC
    html = _page(
        world.audrey,
        occurred_from="2025-03-04T14:02",
        occurred_to="2025-03-04T14:03",
        use_case=world.acme_chatbot.pk,
    )
    assert _request_ids(html) == {"req-1402", "req-wait"}
    assert "2025-03-04 14:02:15" in html
    assert "From (UTC)" in html
    assert "To (UTC)" in html
    assert 'type="datetime-local"' in html

    rejected = _page(world.audrey, decision="rejected", occurred_from="2025-03-04T14:02")
    assert _request_ids(rejected) == {"req-1402", "req-1405"}
    shed = _page(world.audrey, decision="shed")
    assert _request_ids(shed) == {"req-globex"}
    none = _page(world.audrey, request_id="no-such-request")
    assert _request_ids(none) == set()
    assert "No decision matches this search" in none


# --- scoping: a developer sees their own tenants' decisions only -----------------------------
def test_alice_sees_only_acme_and_bobs_request_finds_nothing(world: World) -> None:
    html = _page(world.alice)
    assert _request_ids(html) == {"req-1402", "req-1405", "req-wait"}
    assert "globex" not in html

    hidden = _page(world.alice, request_id="req-globex")
    assert _request_ids(hidden) == set()
    assert "No decision matches this search in your tenants" in hidden

    # Nor can she pick globex's use case: it is not among her choices, like one that never was.
    foreign = _page(world.alice, use_case=world.globex_search.pk)
    assert "Select a valid choice" in foreign
    assert _request_ids(foreign) == set()
    assert "globex/search" not in foreign

    bobs = _page(world.bob)
    assert _request_ids(bobs) == {"req-globex"}
    assert "queue deadline passed" in bobs
    search = reverse("portal:use_case_detail", args=[world.globex_search.pk])
    assert f'<a href="{search}">' in bobs


def test_a_use_case_the_viewer_cannot_open_is_named_by_id_without_a_link(world: World) -> None:
    AdmissionDecision.objects.create(
        stream_id="9-0",
        request_id="req-standalone",
        occurred_at=AT_1402,
        decision="rejected",
        reason="queue_full",
        tenant="acme",
        # The persister takes an unknown use case's tenant from the slug it was seen under.
        tenant_id=world.acme_chatbot.tenant_id,
        use_case_id=999_999,  # as a standalone gateway saw it: no such use case here
        model="llama-3.1-8b",
    )
    html = _page(world.alice, request_id="req-standalone")
    assert "#999999" in html
    assert "queue full" in html
    assert "/use-cases/999999/" not in html


def test_mallory_without_a_role_is_refused(world: World) -> None:
    response = world.mallory.get(URL)
    assert response.status_code == 403
    html = unescape(response.content.decode())
    assert "no Switchyard role" in html
    assert "req-1402" not in html


def test_signed_out_visitors_are_sent_to_sign_in(world: World) -> None:
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


# --- bad input is a field error, never a 500 -------------------------------------------------
@pytest.mark.parametrize(
    ("query", "field", "error"),
    [
        ({"occurred_from": "yesterday"}, "occurred_from", "Enter a valid date/time."),
        ({"occurred_to": "2025-13-40T25:61"}, "occurred_to", "Enter a valid date/time."),
        (
            {"occurred_from": "2025-03-04T14:03", "occurred_to": "2025-03-04T14:02"},
            "occurred_to",
            "Choose a time after “From”.",
        ),
        ({"decision": "maybe"}, "decision", "Select a valid choice."),
        ({"use_case": "not-a-number"}, "use_case", "Select a valid choice."),
        ({"use_case": "99999999999999999999999"}, "use_case", "Select a valid choice."),
        ({"request_id": "r" * 129}, "request_id", "at most 128 characters"),
    ],
)
def test_bad_input_shows_a_field_error(
    world: World, query: dict[str, str], field: str, error: str
) -> None:
    response = world.audrey.get(URL, query)
    assert response.status_code == 200
    form = response.context["form"]
    assert error in " ".join(form.errors[field])
    html = unescape(response.content.decode())
    assert error in html
    assert f'id="id_{field}_error"' in html  # beside its field
    assert "Correct the search fields marked above." in html
    assert _request_ids(html) == set()


# --- pagination ------------------------------------------------------------------------------
def test_the_list_is_paginated_fifty_a_page_keeping_the_search(world: World) -> None:
    AdmissionDecision.objects.bulk_create(
        AdmissionDecision(
            stream_id=f"100-{n}",
            request_id=f"bulk-{n:03d}",
            occurred_at=AT_1402 + timedelta(hours=1, seconds=n),
            decision="rejected",
            reason=TPM,
            tenant="acme",
            tenant_id=world.acme_chatbot.tenant_id,
            use_case_id=world.acme_chatbot.pk,
            model="llama-3.1-8b",
        )
        for n in range(120)
    )
    first = world.audrey.get(URL, {"decision": "rejected"})
    page = first.context["page"]
    assert (page.number, page.paginator.num_pages, page.paginator.count) == (1, 3, 122)
    html = unescape(first.content.decode())
    assert html.count("<code>bulk-") == 50
    assert "<code>bulk-119</code>" in html  # newest first
    assert "Page 1 of 3" in html
    assert 'href="?decision=rejected&page=2"' in html

    last = unescape(world.audrey.get(URL, {"decision": "rejected", "page": "3"}).content.decode())
    assert last.count("<code>bulk-") == 20
    assert _request_ids(last) == {"req-1402", "req-1405"}  # the oldest two, on the last page
    assert 'href="?decision=rejected&page=2"' in last

    for nonsense in ("abc", "999", "-1"):
        assert world.audrey.get(URL, {"page": nonsense}).status_code == 200


# --- navigation --------------------------------------------------------------------------
def test_the_nav_links_the_page_for_people_with_a_role(world: World) -> None:
    link = f'<a href="{URL}"'
    assert link in world.audrey.get(reverse("portal:home")).content.decode()
    assert link in world.alice.get(reverse("portal:dashboard")).content.decode()
    assert f'{link} aria-current="page">' in world.audrey.get(URL).content.decode()
    assert link not in world.mallory.get(reverse("portal:home")).content.decode()
    assert link not in Client().get(reverse("portal:home")).content.decode()

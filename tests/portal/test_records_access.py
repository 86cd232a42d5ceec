"""Who may open which records page: every portal view × persona.

alice develops for acme (whose faq use case opens its records to developers and whose
chatbot does not); bob develops for globex; olivia is an officer, audrey an auditor, root an
admin, mallory has no role. A record outside a person's scope is a 404, like a missing one;
pages beyond a role are 404 as the review queue is; the anonymous are sent to sign in.
Nothing on these pages changes a record: a POST is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from governance.roles import Role
from testkit.factories import make_tenant, make_use_case, make_user
from testkit.records import make_record

pytestmark = pytest.mark.django_db

PERSONAS = ("alice", "bob", "olivia", "audrey", "root", "mallory", "anonymous")


@pytest.fixture
def world() -> dict[str, Any]:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    users = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
        "root": make_user("root", Role.ADMIN),
        "mallory": make_user("mallory"),
    }
    return {
        "users": users,
        "closed": make_record(make_use_case(acme, "chatbot")),
        "open": make_record(make_use_case(acme, "faq", records_visible_to_developers=True)),
    }


@dataclass(frozen=True)
class Page:
    name: str
    url: Callable[[dict[str, Any]], str]
    expect: dict[str, int]


def everyone(status: int, **overrides: int) -> dict[str, int]:
    base = dict.fromkeys(PERSONAS, status)
    return {**base, "mallory": 404, "anonymous": 302, **overrides}


PAGES = [
    Page("records", lambda w: "/records/", everyone(200)),
    Page("record-open", lambda w: f"/records/{w['open'].record_id}/", everyone(200, bob=404)),
    Page(
        "record-closed",
        lambda w: f"/records/{w['closed'].record_id}/",
        everyone(200, alice=404, bob=404),
    ),
    Page("record-missing", lambda w: "/records/nosuchrecord/", everyone(404)),
    Page("records-export", lambda w: "/records/export/?format=csv", everyone(200)),
    Page("audit-trail", lambda w: "/audit/", everyone(200, alice=404, bob=404)),
    Page("audit-export", lambda w: "/audit/export/", everyone(200, alice=404, bob=404)),
]


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_records_pages_by_persona(world: dict[str, Any], page: Page, persona: str) -> None:
    client = Client()
    if persona != "anonymous":
        client.force_login(world["users"][persona])
    response: Any = client.get(page.url(world))
    assert response.status_code == page.expect[persona], (
        f"{persona} GET {page.url(world)} → {response.status_code}"
    )
    if response.status_code == 302:
        assert response["Location"].startswith("/accounts/login/")
    if response.streaming:
        b"".join(response.streaming_content)  # let the export finish (and audit itself)


@pytest.mark.parametrize("url", ["/records/", "/records/export/", "/audit/", "/audit/export/"])
def test_nothing_on_the_records_pages_accepts_a_change(world: dict[str, Any], url: str) -> None:
    client = Client()
    client.force_login(world["users"]["root"])
    assert client.post(url, {}).status_code == 405


def test_the_navigation_offers_records_and_the_audit_trail_by_role(world: dict[str, Any]) -> None:
    def nav(persona: str) -> str:
        client = Client()
        client.force_login(world["users"][persona])
        page = client.get("/").content.decode()
        return page[page.index('aria-label="Main"') : page.index("</nav>")]

    assert 'href="/records/"' in nav("audrey")
    assert 'href="/audit/"' in nav("audrey")
    assert 'href="/records/"' in nav("alice")
    assert 'href="/audit/"' not in nav("alice")
    assert 'href="/records/"' not in nav("mallory")

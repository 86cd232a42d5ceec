"""The dashboard shows one page of use cases and one of keys, each paged on its own.

Personas: olivia is an officer (sees every tenant), alice a developer of acme only.
"""

from __future__ import annotations

from html import unescape
from typing import Any

import pytest
from django.test import Client

from governance.roles import Role
from portal import views
from testkit.factories import make_key, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def per_page(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(views, "DASHBOARD_ROWS_PER_PAGE", 2)
    return 2


def test_use_cases_and_keys_are_paged_separately_newest_first(per_page: int) -> None:
    acme = make_tenant("acme")
    globex = make_tenant("globex")
    cases = [make_use_case(acme if n % 2 else globex, f"case-{n}") for n in range(5)]
    for n in range(3):
        make_key(cases[0], name=f"key-{n}")
    olivia = _client(make_user("olivia", Role.OFFICER))

    first = unescape(olivia.get("/dashboard/").text)
    assert "(case-4)" in first
    assert "(case-3)" in first
    assert "(case-2)" not in first
    assert "Page 1 of 3" in first  # five use cases, two a page
    assert "Page 1 of 2" in first  # three keys
    assert 'href="?page=2"' in first
    assert 'href="?keys_page=2"' in first

    third = unescape(olivia.get("/dashboard/", {"page": "3", "keys_page": "2"}).text)
    assert "Page 3 of 3" in third
    assert "Page 2 of 2" in third
    assert 'href="?page=2&keys_page=2"' in third.replace("&amp;", "&")
    assert "(case-0)" in third  # the oldest use case is last
    assert "(case-4)" not in third
    assert "key-0" in third
    assert "key-2" not in third


def test_a_developer_pages_only_through_their_own_tenants(per_page: int) -> None:
    acme = make_tenant("acme")
    globex = make_tenant("globex")
    for n in range(3):
        make_use_case(acme, f"acme-{n}")
        make_use_case(globex, f"globex-{n}")
    alice = _client(make_user("alice", Role.DEVELOPER, tenants=(acme,)))
    pages = [unescape(alice.get("/dashboard/", {"page": str(n)}).text) for n in (1, 2)]
    assert all("Page" in page and "of 2" in page for page in pages)
    shown = "".join(pages)
    assert all(f"(acme-{n})" in shown for n in range(3))
    assert "globex-" not in shown


def test_an_out_of_range_page_shows_the_last_one() -> None:
    acme = make_tenant("acme")
    make_use_case(acme, "only")
    olivia = _client(make_user("olivia", Role.OFFICER))
    response = olivia.get("/dashboard/", {"page": "99"})
    assert response.status_code == 200
    assert "(only)" in response.text

"""The portal's dead-letters page: officers see async tasks that failed every attempt and
replay or discard them with a button; auditors look; developers find no such page.

Personas: olivia is a governance officer, audrey an auditor, alice a developer of tenant acme.
The dead letters are written on real Valkey as the batcher writes them
(testkit/dead_letters.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import unescape

import pytest
import valkey
from django.test import Client
from django.urls import reverse

from gateway.async_tasks import layout
from governance.models import AuditEvent, UseCase
from governance.roles import Role
from ops.processes import free_port
from testkit.dead_letters import dead_letter, entry_of, status_of
from testkit.factories import make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

URL = "/async/dead-letters/"
FAILED_MS = 1_764_240_000_000  # 2025-11-27 10:40:00 UTC


@dataclass
class World:
    acme_search: UseCase
    olivia_user: object
    audrey: Client
    alice: Client


def _client_for(user, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.fixture
def world(settings, valkey_url: str, valkey_client: valkey.Valkey) -> World:
    settings.VALKEY_URL = valkey_url
    acme = make_tenant("acme")
    return World(
        acme_search=make_use_case(acme, "search"),
        olivia_user=make_user("olivia", Role.OFFICER),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
    )


def _page(client: Client, **query: str) -> str:
    response = client.get(URL, query)
    assert response.status_code == 200, response.content.decode()
    return unescape(response.content.decode())


def _form(html: str, action: str) -> dict[str, str]:
    """The hidden fields of the form posting to ``action``, as a browser would send them."""
    match = re.search(
        rf'<form method="post" action="{re.escape(action)}"[^>]*>(.*?)</form>', html, re.S
    )
    assert match, f"no form posts to {action}"
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', match[1]))


def test_olivia_sees_the_dead_letters_with_what_failed_and_the_navigation_links_there(
    world: World, valkey_client: valkey.Valkey
) -> None:
    assert reverse("portal:async_dead_letters") == URL
    entry_id, task_id, _ = dead_letter(
        valkey_client, world.acme_search, failed_ms=FAILED_MS, message="replica gone"
    )
    olivia = _client_for(world.olivia_user)

    html = _page(olivia)

    assert f'<a href="{URL}" aria-current="page">Dead letters</a>' in html
    row = re.search(r"<tbody>(.*?)</tbody>", html, re.S)
    assert row
    cells = row[1]
    assert f'<code class="hash">{task_id}</code>' in cells
    detail = reverse("portal:use_case_detail", args=[world.acme_search.pk])
    assert f'<a href="{detail}"><code>acme/search</code></a>' in cells
    assert "<code>embed</code>" in cells
    assert '<td class="details">replica gone</td>' in cells
    assert f'<td class="num">{layout.MAX_ATTEMPTS}</td>' in cells
    assert "2025-11-27 10:40:00" in cells
    assert f'action="{URL}{entry_id}/replay/"' in cells
    assert f'action="{URL}{entry_id}/discard/"' in cells
    assert 'style="' not in html  # the CSP allows no inline styles
    assert "<script>" not in html  # nor inline scripts


def test_olivia_replays_a_task_with_the_form_and_its_csrf_token(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    olivia = _client_for(world.olivia_user, csrf=True)
    action = f"{URL}{entry_id}/replay/"
    form = _form(_page(olivia), action)
    assert "csrfmiddlewaretoken" in form

    assert olivia.post(action).status_code == 403  # no token: refused, nothing happens
    assert valkey_client.xlen(layout.dead_letters()) == 1

    response = olivia.post(action, form, follow=True)

    assert response.status_code == 200
    html = unescape(response.content.decode())
    assert f"Task {task_id} is queued again (attempts reset)." in html
    assert "No async task is dead-lettered." in html
    assert valkey_client.xlen(fields["stream"]) == 1
    assert entry_of(valkey_client, fields["stream"], "-")["task"] == task_id
    assert status_of(valkey_client, task_id) == "queued"
    assert AuditEvent.objects.get(action="async.dead_letter_replay").actor == "olivia"

    # A second click (a stale page) says it is gone and queues nothing more.
    again = olivia.post(action, form, follow=True)
    assert "it was replayed, discarded or never was" in unescape(again.content.decode())
    assert valkey_client.xlen(fields["stream"]) == 1


def test_olivia_discards_a_task_and_it_stays_failed(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, fields = dead_letter(valkey_client, world.acme_search)
    olivia = _client_for(world.olivia_user)

    response = olivia.post(f"{URL}{entry_id}/discard/", follow=True)

    assert f"The dead letter of task {task_id} is discarded." in unescape(response.content.decode())
    assert valkey_client.xlen(layout.dead_letters()) == 0
    assert valkey_client.xlen(fields["stream"]) == 0
    assert status_of(valkey_client, task_id) == "failed"
    assert AuditEvent.objects.get(action="async.dead_letter_discard").actor == "olivia"


def test_the_page_is_paged_newest_first_and_a_decision_returns_to_its_page(
    world: World, valkey_client: valkey.Valkey, monkeypatch
) -> None:
    monkeypatch.setattr("portal.async_views.DEAD_LETTERS_PER_PAGE", 2)
    letters = [dead_letter(valkey_client, world.acme_search) for _ in range(3)]
    olivia = _client_for(world.olivia_user)

    first = _page(olivia)
    assert [t for _, t, _ in letters if f'<code class="hash">{t}</code>' in first] == [
        letters[1][1],
        letters[2][1],
    ]
    older = re.search(r'<a href="([^"]+)" rel="next">Older →</a>', first)
    assert older
    second = _page(olivia, before=older[1].split("before=")[1])
    assert f'<code class="hash">{letters[0][1]}</code>' in second
    assert "Older →" not in second
    assert f'<a href="{URL}">← Newest</a>' in second

    oldest = letters[0][0]
    action = f"{URL}{oldest}/replay/"
    response = olivia.post(action, _form(second, action))
    assert response.status_code == 302
    assert response["Location"] == older[1]


def test_audrey_reads_without_buttons_and_may_not_post(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, task_id, _ = dead_letter(valkey_client, world.acme_search)

    html = _page(world.audrey)

    assert f'<code class="hash">{task_id}</code>' in html
    assert "Read-only" in html
    assert "/replay/" not in html
    refused = world.audrey.post(f"{URL}{entry_id}/replay/")
    assert refused.status_code == 403
    assert "Only a governance officer or an admin" in unescape(refused.content.decode())
    assert valkey_client.xlen(layout.dead_letters()) == 1


def test_a_developer_finds_no_such_page_and_no_link(
    world: World, valkey_client: valkey.Valkey
) -> None:
    entry_id, _, _ = dead_letter(valkey_client, world.acme_search)

    assert world.alice.get(URL).status_code == 404
    assert world.alice.post(f"{URL}{entry_id}/replay/").status_code == 404
    assert world.alice.post(f"{URL}{entry_id}/discard/").status_code == 404
    assert valkey_client.xlen(layout.dead_letters()) == 1
    home = unescape(world.alice.get(reverse("portal:dashboard")).content.decode())
    assert "Dead letters" not in home


def test_valkey_out_of_reach_says_so_and_changes_nothing(world: World, settings) -> None:
    settings.VALKEY_URL = f"valkey://127.0.0.1:{free_port()}/0"
    olivia = _client_for(world.olivia_user)

    page = olivia.get(URL)
    assert page.status_code == 503
    assert "cannot be reached" in unescape(page.content.decode())
    replay = olivia.post(f"{URL}1-0/replay/", follow=True)
    assert "cannot be reached; nothing was changed" in unescape(replay.content.decode())
    assert not AuditEvent.objects.filter(action__startswith="async.").exists()

"""A developer's onboarding in the portal: request a use case, follow its status, get a key
and ready-to-paste code for it.

Personas: alice and carol are developers of tenant acme, bob a developer of tenant globex,
olivia and oscar governance officers, audrey an auditor, mallory has an account and no role.
"""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.models import ApiKey, AuditEvent, Tenant, UseCase
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

GATEWAY = "https://gateway.example.test"


@dataclass
class World:
    acme: Tenant
    globex: Tenant
    acme_chatbot: UseCase
    alice: Client
    carol: Client
    bob: Client
    olivia: Client
    oscar: Client
    audrey: Client
    mallory: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(settings) -> World:
    settings.GATEWAY_PUBLIC_URL = GATEWAY
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama, qwen = make_model("llama-3.1-8b"), make_model("qwen-2.5-7b")
    return World(
        acme=acme,
        globex=globex,
        acme_chatbot=make_use_case(acme, "chatbot", models=(llama, qwen)),
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        carol=_client_for(make_user("carol", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
        oscar=_client_for(make_user("oscar", Role.OFFICER)),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        mallory=_client_for(make_user("mallory")),
    )


def _ask(client: Client, tenant: Tenant, slug: str = "claims-triage"):
    return client.post(
        reverse("portal:use_case_request"),
        {
            "tenant": tenant.pk,
            "name": "Claims triage",
            "slug": slug,
            "kind": "extraction",
            "purpose": "Sort incoming claims by urgency; needs llama-3.1-8b.",
            "data_classification": "confidential",
            "ticket_ref": "CHG-1234",
        },
    )


def _status(client: Client, use_case: UseCase) -> str:
    response = client.get(reverse("portal:use_case_status", args=[use_case.pk]))
    assert response.status_code == 200
    return unescape(response.content.decode())


def _transition(client: Client, use_case: UseCase, transition: str, reason: str = ""):
    return client.post(
        reverse("portal:use_case_transition", args=[use_case.pk]),
        {"transition": transition, "reason": reason},
    )


# --- requesting a use case ----------------------------------------------------------------
def test_a_developer_requests_a_use_case_and_sees_its_status_move(world: World) -> None:
    response = _ask(world.alice, world.acme)
    use_case = UseCase.objects.get(tenant=world.acme, slug="claims-triage")
    assert response.status_code == 302
    assert response["Location"] == reverse("portal:use_case_detail", args=[use_case.pk])
    assert use_case.status == UseCaseStatus.SUBMITTED
    assert use_case.data_classification == "confidential"
    assert use_case.ticket_ref == "CHG-1234"
    assert list(use_case.allowed_models.all()) == []  # the officer chooses them

    waiting = _status(world.alice, use_case)
    assert "waiting for a governance officer" in waiting
    assert 'hx-trigger="every 5s"' in waiting  # the page keeps asking until it is decided
    assert "Drafted" in waiting
    assert "Requested" in waiting
    assert "Approved" not in waiting

    # olivia sends it back with a reason; alice sees why; she resubmits; olivia approves.
    assert _transition(world.olivia, use_case, "reject", "Name the models you need").status_code
    assert "Sent back to draft" in _status(world.alice, use_case)
    assert "“Name the models you need”" in _status(world.alice, use_case)
    _transition(world.alice, use_case, "submit")
    _transition(world.olivia, use_case, "approve")
    use_case.refresh_from_db()
    assert use_case.status == UseCaseStatus.APPROVED
    done = _status(world.alice, use_case)
    steps = [
        line.split("<strong>")[1].split("</strong>")[0]
        for line in done.splitlines()
        if "<li><strong>" in line
    ]
    assert steps == ["Drafted", "Requested", "Sent back to draft", "Requested", "Approved"]
    assert "hx-trigger" not in done  # decided: no more polling
    assert "by olivia" in done

    detail = world.alice.get(reverse("portal:use_case_detail", args=[use_case.pk]))
    assert reverse("portal:use_case_status", args=[use_case.pk]) in detail.content.decode()
    actions = AuditEvent.objects.filter(object_id=str(use_case.pk)).values_list("action", flat=True)
    assert list(actions)[:2] == ["usecase.create", "usecase.submit"]


def test_the_officer_who_requested_a_use_case_cannot_approve_it(world: World) -> None:
    _ask(world.oscar, world.acme)
    use_case = UseCase.objects.get(slug="claims-triage")
    assert use_case.status == UseCaseStatus.SUBMITTED
    refused = _transition(world.oscar, use_case, "approve")
    assert refused.status_code == 403
    assert "another officer must approve it" in refused.content.decode()
    use_case.refresh_from_db()
    assert use_case.status == UseCaseStatus.SUBMITTED
    _transition(world.olivia, use_case, "approve")
    use_case.refresh_from_db()
    assert use_case.status == UseCaseStatus.APPROVED


def test_a_developer_cannot_approve_her_own_request(world: World) -> None:
    _ask(world.alice, world.acme)
    use_case = UseCase.objects.get(slug="claims-triage")
    assert _transition(world.alice, use_case, "approve").status_code == 403
    use_case.refresh_from_db()
    assert use_case.status == UseCaseStatus.SUBMITTED


def test_a_developer_requests_only_for_her_own_tenants(world: World) -> None:
    page = world.bob.get(reverse("portal:use_case_request")).content.decode()
    assert f'<option value="{world.globex.pk}"' in page
    assert f'<option value="{world.acme.pk}"' not in page
    response = _ask(world.bob, world.acme)
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not UseCase.objects.filter(slug="claims-triage").exists()


@pytest.mark.parametrize("who", ["audrey", "mallory"])
def test_auditors_and_people_without_a_role_cannot_request_a_use_case(
    world: World, who: str
) -> None:
    client = getattr(world, who)
    assert client.get(reverse("portal:use_case_request")).status_code == 403
    assert _ask(client, world.acme).status_code == 403
    assert not UseCase.objects.filter(slug="claims-triage").exists()


def test_a_duplicate_identifier_is_refused_with_the_reason_and_nothing_is_left(
    world: World,
) -> None:
    response = _ask(world.alice, world.acme, slug="chatbot")
    assert response.status_code == 200
    assert "already exists" in unescape(response.content.decode())
    assert UseCase.objects.filter(tenant=world.acme, slug="chatbot").count() == 1


def test_another_tenants_developer_cannot_see_the_status(world: World) -> None:
    url = reverse("portal:use_case_status", args=[world.acme_chatbot.pk])
    assert world.bob.get(url).status_code == 404
    assert world.carol.get(url).status_code == 200


# --- a key, revealed once, with code for four clients -------------------------------------
def _revealed(world: World) -> tuple[ApiKey, str, str]:
    world.alice.post(
        reverse("portal:key_request", args=[world.acme_chatbot.pk]),
        {"name": "checkout", "reason": "The checkout service answers questions."},
    )
    key = ApiKey.objects.get(name="checkout")
    world.olivia.post(reverse("portal:key_decide", args=[key.pk]), {"decision": "approve"})
    response = world.alice.post(reverse("portal:key_reveal", args=[key.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    start = html.index('id="secret-key">') + len('id="secret-key">')
    return key, html[start : html.index("</code>", start)], unescape(html)


def _snippet(html: str, snippet_id: str) -> str:
    start = html.index(f'<code id="{snippet_id}">') + len(f'<code id="{snippet_id}">')
    return html[start : html.index("</code>", start)]


def test_the_reveal_page_has_code_for_curl_both_sdks_and_langchain(world: World) -> None:
    key, plaintext, html = _revealed(world)
    base = f"{GATEWAY}/v1"
    hint = f"{key.prefix}…"
    snippets = {
        name: _snippet(html, f"snippet-{name}")
        for name in ("curl", "python", "javascript", "langchain")
    }
    assert f"curl {base}/chat/completions" in snippets["curl"]
    assert '"model": "llama-3.1-8b"' in snippets["curl"]
    assert f'base_url="{base}"' in snippets["python"]
    assert f'baseURL: "{base}"' in snippets["javascript"]
    assert "from langchain_openai import ChatOpenAI" in snippets["langchain"]
    assert f'base_url="{base}"' in snippets["langchain"]
    for name in ("python", "javascript", "langchain"):
        assert "llama-3.1-8b" in snippets[name], name
        assert "qwen-2.5-7b" in snippets[name], name  # the other model it may call, named
    for name, code in snippets.items():
        assert hint in code, name  # the key's placeholder: its prefix, never the secret
        assert plaintext not in code, name
    compile(snippets["python"], "python-snippet", "exec")
    compile(snippets["langchain"], "langchain-snippet", "exec")
    assert ast.parse(snippets["langchain"]).body[1].names[0].name == "ChatOpenAI"  # type: ignore[attr-defined]
    # Each snippet has its own copy button (static JS: portal.js), with a spoken status.
    for name in snippets:
        assert f'data-copy="snippet-{name}"' in html
        assert f'id="snippet-{name}-status"' in html


def test_the_javascript_snippet_is_valid_javascript(world: World, tmp_path: Path) -> None:
    _, _, html = _revealed(world)
    source = tmp_path / "snippet.mjs"
    source.write_text(_snippet(html, "snippet-javascript"))
    checked = subprocess.run(["node", "--check", str(source)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_a_key_is_revealed_once_and_a_second_reveal_is_refused(world: World) -> None:
    key, plaintext, _ = _revealed(world)
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.ACTIVE
    again = world.alice.post(reverse("portal:key_reveal", args=[key.pk]), follow=True)
    assert again.redirect_chain == [(reverse("portal:key_detail", args=[key.pk]), 302)]
    assert "already revealed; it cannot be shown again" in unescape(again.content.decode())
    assert plaintext not in again.content.decode()
    assert "secret-key" not in again.content.decode()
    assert AuditEvent.objects.filter(action="apikey.reveal").count() == 1

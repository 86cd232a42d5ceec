"""The guardrail-findings page (officers and auditors) and the guardrails on a use case's page.

Findings reach the database as the gateway writes them: XADDed to a real Valkey and persisted
by the real persister. olivia is an officer, audrey an auditor, alice a developer of acme,
mallory has no role.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import orjson
import pytest
import valkey
from django.test import Client

from gateway.accounting import GUARDRAIL_FIELDS, GUARDRAILS_STREAM
from governance.models import GuardrailSelection
from governance.roles import Role
from records.usage import usage_persist
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

URL = "/guardrail-findings/"
AT = datetime(2025, 3, 4, 14, 2, 15, tzinfo=UTC)


def _gateway_finds(client: valkey.Valkey, at: datetime, **values: object) -> None:
    fields: dict[str, object] = dict.fromkeys(GUARDRAIL_FIELDS, "")
    fields.update(
        at_ms=int(at.timestamp() * 1000),
        tenant="acme",
        key_id=11,
        model="llama",
        stage="request",
        action="redacted",
        entities=orjson.dumps({"EMAIL_ADDRESS": 2}).decode(),
        score=0.9,
        policy_version=3,
    )
    fields.update(values)
    client.xadd(GUARDRAILS_STREAM, {k: str(v) for k, v in fields.items()})


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(valkey_client: valkey.Valkey):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    search = make_use_case(globex, "search", models=(llama,))
    _gateway_finds(valkey_client, AT, request_id="req-pii", use_case_id=chatbot.pk, guardrail="pii")
    _gateway_finds(
        valkey_client,
        AT + timedelta(minutes=1),
        request_id="req-inject",
        use_case_id=chatbot.pk,
        guardrail="prompt_injection",
        action="blocked",
        entities='{"injection": 1}',
    )
    _gateway_finds(
        valkey_client,
        AT + timedelta(minutes=2),
        request_id="req-globex",
        tenant="globex",
        use_case_id=search.pk,
        guardrail="pii",
        stage="response",
    )
    assert usage_persist(client=valkey_client, consumer="portal-tests").findings == 3
    return {
        "chatbot": chatbot,
        "search": search,
        "olivia": _client_for(make_user("olivia", Role.OFFICER)),
        "audrey": _client_for(make_user("audrey", Role.AUDITOR)),
        "alice": _client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        "mallory": _client_for(make_user("mallory")),
    }


def _page(client: Client, **query: str | int) -> str:
    response = client.get(URL, query)
    assert response.status_code == 200, response.content.decode()[:2000]
    return unescape(response.content.decode())


def _table(html: str, table_id: str) -> str:
    found = re.search(rf'<table id="{table_id}".*?</table>', html, re.DOTALL)
    assert found is not None, f"no table {table_id}"
    return found.group(0)


def _request_ids(html: str) -> set[str]:
    rows = _table(html, "findings")
    return {r for r in ("req-pii", "req-inject", "req-globex") if f"<code>{r}</code>" in rows}


def _counts(html: str) -> list[tuple[str, str, int]]:
    rows = re.findall(
        r"<tr><td><code>(\w+)</code></td><td>.*?>(\w+)<.*?</td><td class=\"num\">(\d+)</td></tr>",
        _table(html, "finding-counts"),
        re.DOTALL,
    )
    return [(g, a, int(n)) for g, a, n in rows]


@pytest.mark.parametrize("who", ["olivia", "audrey"])
def test_officers_and_auditors_see_every_finding_with_counts(world, who) -> None:
    html = _page(world[who])

    assert _request_ids(html) == {"req-pii", "req-inject", "req-globex"}
    assert _counts(html) == [("pii", "redacted", 2), ("prompt_injection", "blocked", 1)]
    findings = _table(html, "findings")
    assert "<code>EMAIL_ADDRESS</code> ×2" in findings
    assert "<code>injection</code> ×1" in findings


def test_the_search_narrows_the_table_and_the_counts(world) -> None:
    html = _page(world["audrey"], guardrail="pii")
    assert _request_ids(html) == {"req-pii", "req-globex"}
    assert _counts(html) == [("pii", "redacted", 2)]

    html = _page(world["audrey"], action="blocked")
    assert _request_ids(html) == {"req-inject"}

    html = _page(world["audrey"], use_case=world["search"].pk)
    assert _request_ids(html) == {"req-globex"}

    html = _page(world["audrey"], occurred_from="2025-03-04T14:04")
    assert _request_ids(html) == {"req-globex"}


def test_bad_search_input_is_a_field_error(world) -> None:
    html = _page(world["audrey"], action="shouted")
    assert "Select a valid choice" in html
    assert "Correct the search fields marked above." in html
    assert 'id="findings"' not in html


@pytest.mark.parametrize("who", ["alice", "mallory"])
def test_the_page_is_refused_to_developers_and_people_without_a_role(world, who) -> None:
    response = world[who].get(URL)
    assert response.status_code == 404
    assert "req-pii" not in response.content.decode()


def test_signed_out_visitors_are_sent_to_sign_in(world) -> None:
    response = Client().get(URL)
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


def test_the_use_case_page_shows_selections_in_order_and_findings_counts(world) -> None:
    """GIVEN acme/chatbot with two guardrails and persisted findings WHEN alice opens its page
    THEN she reads each selection's stage, mode and settings in run order, and the counts."""
    chatbot = world["chatbot"]
    GuardrailSelection.objects.create(
        use_case=chatbot,
        guardrail="prompt_injection",
        side="request",
        action="block",
        config={"threshold": 0.8},
        position=1,
    )
    GuardrailSelection.objects.create(
        use_case=chatbot,
        guardrail="pii",
        side="both",
        action="redact",
        config={"entities": ["EMAIL_ADDRESS"], "custom": [{"name": "staff_id"}], "strict": True},
        position=0,
    )
    response = world["alice"].get(f"/use-cases/{chatbot.pk}/")
    assert response.status_code == 200
    html = unescape(response.content.decode())

    rows = re.findall(
        r"<tr>\s*<td class=\"num\">(\d)</td>(.*?)</tr>", _table(html, "guardrails"), re.DOTALL
    )
    assert [(n, re.sub(r"<[^>]+>", "", body.replace("<br>", " ")).split()) for n, body in rows] == [
        (
            "1",
            [
                "pii",
                "Request",
                "and",
                "response",
                "Redact",
                # by name: PostgreSQL's jsonb keeps no key order
                "custom:",
                '{"name":',
                '"staff_id"}',
                "entities:",
                "EMAIL_ADDRESS",
                "strict:",
                "true",
            ],
        ),
        ("2", ["prompt_injection", "Request", "Block", "threshold:", "0.8"]),
    ]
    counts = _table(html, "use-case-finding-counts")
    assert '<td><code>pii</code></td><td>redacted</td><td class="num">1</td>' in counts
    assert '<td><code>prompt_injection</code></td><td>blocked</td><td class="num">1</td>' in counts
    assert "Fail closed (refuse with 503)" in html
    # alice is a developer: the findings page is not hers to open, so no link to it.
    assert URL not in html


def test_the_nav_links_the_page_for_officers_and_auditors_only(world) -> None:
    assert f'href="{URL}"' in world["audrey"].get("/dashboard/").content.decode()
    assert f'href="{URL}"' in world["olivia"].get("/dashboard/").content.decode()
    assert f'href="{URL}"' not in world["alice"].get("/dashboard/").content.decode()

"""The audit trail page: exact filters, pagination, the chain verified from the page (intact
and tampered), the signed export downloaded and checked, every view, verification and
download itself audited, and everyone else refused.

Personas: audrey is an auditor, olivia an officer, alice a developer of acme, nick has no role.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from governance.audit import Actor, audit_record
from governance.audit_export import export_verify, signing_public_key
from governance.models import AuditEvent, Tenant
from governance.roles import Role
from portal.audit import views as audit_views
from testkit.factories import make_tenant, make_user
from tests.governance.test_audit import _tamper

pytestmark = pytest.mark.django_db


def _client(username: str, *roles: Role, tenants: tuple[Tenant, ...] = ()) -> Client:
    user: Any = make_user(username, *roles, tenants=tenants)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def acme() -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def audrey() -> Client:
    return _client("audrey", Role.AUDITOR)


def _event(action: str, *, actor: str = "system:tests", tenant: str = "", **fields: Any) -> int:
    event = audit_record(
        actor=Actor(username=actor, is_system=True),
        action=action,
        tenant_slug=tenant,
        **fields,
    )
    return event.sequence


def _rows(response: Any) -> list[int]:
    """The sequence numbers in the events table, in the order shown."""
    text = unescape(response.content.decode())
    if 'id="audit-events"' not in text:
        return []
    table = text[
        text.index('id="audit-events"') : text.index("</table>", text.index("audit-events"))
    ]
    return [int(cell.split("<")[0]) for cell in table.split('<td class="num">')[1:]]


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("sequence"))


def _after(event: AuditEvent) -> dict[str, Any]:
    assert isinstance(event.after, dict), event.after
    return event.after


def _body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


# --- filters ----------------------------------------------------------------------------------
def test_each_filter_is_exact_and_they_combine(audrey: Client, acme: Tenant) -> None:
    globex = make_tenant("globex")
    bob = _event("tenant.update", actor="bob", tenant="acme", obj=acme)
    _event("tenant.update", actor="bobby", tenant="acme", obj=acme)
    globex_by_bob = _event("tenant.update", actor="bob", tenant="globex", obj=globex)
    key_event = _event("key.approved", actor="bob", tenant="acme")

    assert _rows(audrey.get("/audit/", {"actor": "bob", "action": "tenant.update"})) == [
        globex_by_bob,
        bob,
    ]
    assert _rows(audrey.get("/audit/", {"actor": "bob", "tenant": "acme"})) == [key_event, bob]
    by_object = audrey.get(
        "/audit/", {"object_type": "governance.tenant", "object_id": str(globex.pk)}
    )
    assert _rows(by_object) == [globex_by_bob]
    assert _rows(audrey.get("/audit/", {"actor": "bo"})) == []
    assert "No event matches this filter." in audrey.get("/audit/", {"actor": "bo"}).text


def test_the_time_range_is_from_inclusive_to_exclusive(audrey: Client) -> None:
    first = _event("a.first")
    second = _event("a.second")
    at_second = AuditEvent.objects.get(sequence=second).occurred_at.astimezone(UTC)
    at_first = AuditEvent.objects.get(sequence=first).occurred_at.astimezone(UTC)
    iso = "%Y-%m-%dT%H:%M:%S.%f"
    shown = _rows(
        audrey.get(
            "/audit/",
            {"since": at_first.strftime(iso), "until": at_second.strftime(iso)},
        )
    )
    assert shown == [first]
    later = _rows(audrey.get("/audit/", {"since": at_second.strftime(iso)}))
    assert second in later
    assert first not in later


def test_an_inverted_or_malformed_time_range_is_a_400_naming_the_field(audrey: Client) -> None:
    now = datetime.now(UTC)
    inverted = audrey.get(
        "/audit/", {"since": now.isoformat(), "until": (now - timedelta(hours=1)).isoformat()}
    )
    assert inverted.status_code == 400
    assert "The end must be after the start." in inverted.text
    malformed = audrey.get("/audit/", {"since": "yesterday"})
    assert malformed.status_code == 400
    assert "Enter a valid date/time." in malformed.text


def test_the_events_are_paginated_newest_first(
    audrey: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_views, "AUDIT_EVENTS_PER_PAGE", 3)
    made = [_event("paged.event") for _ in range(7)]
    first = audrey.get("/audit/", {"action": "paged.event"})
    assert _rows(first) == made[::-1][:3]
    assert "Page 1 of 3" in first.text
    assert 'href="?action=paged.event&amp;page=2"' in first.text
    last = audrey.get("/audit/", {"action": "paged.event", "page": "3"})
    assert _rows(last) == [made[0]]


# --- verification -----------------------------------------------------------------------------
def test_verifying_an_intact_chain_from_the_page(audrey: Client) -> None:
    for _ in range(4):
        _event("tenant.update")
    before = AuditEvent.objects.count()
    assert "has not been verified from the portal yet" in audrey.get("/audit/").text

    response = audrey.post("/audit/verify/")
    assert response.status_code == 302
    assert response["Location"] == "/audit/#chain-heading"
    (verified,) = _events("audit.verified")
    assert verified.actor == "audrey"
    # Everything before the verification's own event, the page view included.
    assert _after(verified)["ok"] is True
    assert _after(verified)["events_checked"] == before + 1

    page = audrey.get("/audit/").text
    assert f"Verified up to event #{before + 1}," in page
    assert f"(event #{verified.sequence})" in page


def test_verifying_a_tampered_chain_shows_where_and_why(audrey: Client) -> None:
    for _ in range(5):
        _event("tenant.update")
    _tamper("UPDATE governance_auditevent SET actor = 'mallory' WHERE sequence = 3")

    audrey.post("/audit/verify/")
    (verified,) = _events("audit.verified")
    assert _after(verified)["ok"] is False
    assert _after(verified)["first_broken_sequence"] == 3

    page = unescape(audrey.get("/audit/").text)
    assert "Broken at event #3: its content does not match its hash" in page
    assert 'role="alert"' in page


def test_verify_is_a_post_only(audrey: Client) -> None:
    assert audrey.get("/audit/verify/").status_code == 405
    assert _events("audit.verified") == []


# --- the signed export -------------------------------------------------------------------------
@pytest.fixture
def downloaded(audrey: Client, tmp_path: Path) -> Path:
    for n in range(3):
        _event("tenant.update", after={"n": n})
    response = audrey.get("/audit/export/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/jsonl"
    path = tmp_path / "audit.jsonl"
    path.write_bytes(_body(response))
    return path


def test_the_downloaded_export_verifies_and_a_modified_one_does_not(
    downloaded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = downloaded.read_bytes()
    check = export_verify(data, public_key=signing_public_key())
    assert check.ok, check.problem
    assert check.chain_ok
    call_command("audit_export_verify", str(downloaded), "--public-key", signing_public_key())
    assert "audit export verified" in capsys.readouterr().out

    modified = downloaded.with_name("modified.jsonl")
    modified.write_bytes(data.replace(b'"n":1', b'"n":7', 1))
    assert modified.read_bytes() != data
    assert not export_verify(modified.read_bytes(), public_key=signing_public_key()).ok
    with pytest.raises(SystemExit) as exit_info:
        call_command("audit_export_verify", str(modified))
    assert exit_info.value.code == 1
    assert "NOT verified" in capsys.readouterr().err


def test_the_download_is_audited_with_the_sha256_of_what_was_sent(downloaded: Path) -> None:
    import hashlib

    (exported,) = _events("audit.exported")
    assert exported.actor == "audrey"
    assert _after(exported)["complete"] is True
    assert _after(exported)["sha256"] == hashlib.sha256(downloaded.read_bytes()).hexdigest()


# --- every view is audited, and shown as such ----------------------------------------------------
def test_every_view_is_audited_and_listed_as_the_viewers_own(audrey: Client) -> None:
    first = audrey.get("/audit/", {"actor": "nobody"})
    (viewed,) = _events("audit.viewed")
    assert viewed.actor == "audrey"
    assert viewed.after == {"filter": {"actor": "nobody"}, "page": "1"}
    assert "recorded in the trail as event <a" in first.text
    assert f">#{viewed.sequence}</a>" in first.text

    _body(audrey.get("/audit/export/"))
    audrey.post("/audit/verify/")
    page = audrey.get("/audit/").text
    own = page[page.index('id="own-activity"') :]
    for action in ("audit.viewed", "audit.exported", "audit.verified"):
        assert f"<code>{action}</code>" in own
    assert len(_events("audit.viewed")) == 2

    # Someone else's activity is not listed as yours.
    olivia = _client("olivia", Role.OFFICER)
    theirs = olivia.get("/audit/").text
    assert theirs[theirs.index('id="own-activity"') :].count("<code>") == 1  # the view itself


# --- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", [Role.OFFICER, Role.ADMIN, Role.AUDITOR])
def test_officers_admins_and_auditors_may_read_the_trail(role: Role) -> None:
    client = _client(f"reader-{role}", role)
    assert client.get("/audit/").status_code == 200
    assert client.post("/audit/verify/").status_code == 302
    exported = client.get("/audit/export/")
    assert exported.status_code == 200
    _body(exported)  # to its end here: a stream left open audits its end inside a later test


def test_developers_people_without_a_role_and_strangers_are_refused(acme: Tenant) -> None:
    refused = {
        "alice": _client("alice", Role.DEVELOPER, tenants=(acme,)),
        "nick": _client("nick"),
    }
    for who, client in refused.items():
        assert client.get("/audit/").status_code == 404, who
        assert client.post("/audit/verify/").status_code == 404, who
        assert client.get("/audit/export/").status_code == 404, who
    stranger = Client()
    for path in ("/audit/", "/audit/export/"):
        response = stranger.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    assert stranger.post("/audit/verify/").status_code == 302
    assert _events("audit.viewed") == []
    assert _events("audit.verified") == []
    assert _events("audit.exported") == []


def test_a_bad_export_range_is_a_400_naming_the_field_and_nothing_is_exported(
    audrey: Client,
) -> None:
    response = audrey.get("/audit/export/", {"from_sequence": "0"})
    assert response.status_code == 400
    assert "Ensure this value is greater than or equal to 1." in unescape(response.text)
    assert _events("audit.exported") == []


def test_from_htmx_the_verification_answers_with_the_result_alone(audrey: Client) -> None:
    """GIVEN the button's htmx call WHEN it verifies THEN the answer is the result's fragment
    (to swap in place), not a redirect to the page, and no page view is recorded."""
    _event("tenant.update")
    response = audrey.post("/audit/verify/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    fragment = response.text
    assert fragment.lstrip().startswith('<div id="verification"')
    assert "Verified up to event #1," in fragment
    assert "<h1>" not in fragment
    assert _events("audit.viewed") == []
    assert len(_events("audit.verified")) == 1

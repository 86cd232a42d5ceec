"""The signed audit-trail export: it verifies offline, any one changed byte fails it, the
wrong key fails it, a broken chain is reported inside it, and every download is audited."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from governance.audit import Actor, audit_record
from governance.audit_export import (
    AuditExportRange,
    audit_export,
    export_verify,
    parse_signing_key,
    public_key_text,
    signing_public_key,
)
from governance.models import AuditEvent
from governance.roles import Role
from ops.processes import PYTHON, REPO_ROOT
from testkit.factories import make_tenant, make_user
from tests.governance.test_audit import _tamper

pytestmark = pytest.mark.django_db


def _export(**wanted: Any) -> bytes:
    return b"".join(audit_export(actor=Actor.system("tests"), wanted=AuditExportRange(**wanted)))


@pytest.fixture
def trail() -> list[AuditEvent]:
    acme = make_tenant("acme")
    return [
        audit_record(
            actor=Actor.system("tests"),
            action="tenant.update",
            obj=acme,
            tenant_slug="acme",
            after={"name": f"Acme {n}", "note": "ünïcode ✓", "limits": [1, 2.5, None]},
        )
        for n in range(5)
    ]


def test_an_export_verifies_and_says_the_chain_is_intact(trail: list[AuditEvent]) -> None:
    total = AuditEvent.objects.count()
    data = _export()
    lines = data.splitlines()
    assert len(lines) == total + 1

    check = export_verify(data, public_key=signing_public_key())

    assert check.ok, check.problem
    assert check.chain_ok
    assert check.events == total
    assert check.summary["last_sequence"] == trail[-1].sequence
    assert check.summary["chain"]["ok"] is True
    first = orjson.loads(lines[0])
    assert first["sequence"] == 1
    assert first["hash"] == AuditEvent.objects.get(sequence=1).hash


def test_changing_any_one_byte_fails_verification(trail: list[AuditEvent]) -> None:
    data = _export()
    public_key = signing_public_key()
    summary_at = data.rindex(b"\n", 0, len(data) - 1) + 1
    positions = {
        "an event's content": data.index(b"Acme 3"),
        "a hash": data.index(b'"hash":"') + 10,
        "the summary": data.index(b'"events":', summary_at) + 9,
        "the signature": data.index(b'"signature":"', summary_at) + 15,
        "the first byte": 0,
    }
    for where, at in positions.items():
        tampered = bytearray(data)
        tampered[at] = ord("7") if tampered[at] != ord("7") else ord("8")
        check = export_verify(bytes(tampered), public_key=public_key)
        assert not check.ok, f"a byte changed in {where} went unnoticed"
        assert check.problem


def test_dropping_an_event_and_re_signing_with_another_key_fails(trail: list[AuditEvent]) -> None:
    """Someone without the key rewrites the export: removes an event and signs it anew with
    their own key. The file is self-consistent, but not signed by Switchyard's key."""
    data = _export()
    lines = data.splitlines(keepends=True)
    final = orjson.loads(lines[-1])
    kept = lines[:2] + lines[3:-1]  # event #3 removed
    body = b"".join(kept)
    summary = {**final["summary"], "events": len(kept), "sha256": hashlib.sha256(body).hexdigest()}
    forger = parse_signing_key(base64.b64encode(os.urandom(32)).decode())
    forged = (
        body
        + orjson.dumps(
            {
                "summary": summary,
                "algorithm": "Ed25519",
                "public_key": public_key_text(forger.public_key()),
                "signature": base64.b64encode(
                    forger.sign(orjson.dumps(summary, option=orjson.OPT_SORT_KEYS))
                ).decode(),
            }
        )
        + b"\n"
    )

    assert export_verify(forged, public_key=signing_public_key()).problem == (
        "the export was signed by another key"
    )
    # Even trusting the forger's key, the removed event breaks the links.
    check = export_verify(forged)
    assert not check.ok
    assert "does not link to the event before it" in check.problem


def test_a_range_exports_only_those_events_and_still_verifies(trail: list[AuditEvent]) -> None:
    data = _export(from_sequence=trail[1].sequence, to_sequence=trail[3].sequence)
    check = export_verify(data, public_key=signing_public_key())
    assert check.ok, check.problem
    assert check.events == 3
    assert check.summary["range"] == {
        "from_sequence": trail[1].sequence,
        "to_sequence": trail[3].sequence,
    }


def test_an_edited_event_fails_offline_and_the_signed_summary_says_where(
    trail: list[AuditEvent],
) -> None:
    """GIVEN an event rewritten in the database by someone who first dropped its triggers
    WHEN the trail is exported THEN the file's own check finds that event, and the signed
    summary carries the server's verdict: the chain breaks there."""
    assert trail[2].sequence == 3
    _tamper("UPDATE governance_auditevent SET actor = 'mallory' WHERE sequence = 3")
    check = export_verify(_export(), public_key=signing_public_key())
    assert not check.ok
    assert check.problem == f"event #{trail[2].sequence} does not match its hash"
    assert check.summary["chain"]["ok"] is False
    assert check.summary["chain"]["first_broken_sequence"] == trail[2].sequence
    assert "does not match its hash" in check.summary["chain"]["problem"]


def test_the_signing_key_is_the_configured_one(trail: list[AuditEvent]) -> None:
    seed = base64.b64encode(bytes(range(32))).decode()
    expected = public_key_text(parse_signing_key(seed).public_key())
    with override_settings(AUDIT_EXPORT_SIGNING_KEY=seed):
        data = _export()
        assert signing_public_key() == expected
    assert orjson.loads(data.splitlines()[-1])["public_key"] == expected
    assert export_verify(data, public_key=expected).ok
    with pytest.raises(ValueError, match="32 bytes"):
        parse_signing_key(base64.b64encode(b"short").decode())


def test_downloading_the_export_is_audited_in_the_portal_and_the_api(
    trail: list[AuditEvent],
) -> None:
    olivia: Any = make_user("olivia", Role.OFFICER)
    portal = Client()
    portal.force_login(olivia)
    response: Any = portal.get("/audit/export/")
    assert response.status_code == 200
    assert response.streaming
    data = b"".join(response.streaming_content)
    assert export_verify(data, public_key=signing_public_key()).ok
    exported = AuditEvent.objects.filter(action="audit.exported").get()
    assert exported.actor == "olivia"
    assert exported.after == {
        "range": {},
        "events": len(data.splitlines()) - 1,
        "sha256": hashlib.sha256(data).hexdigest(),
        "complete": True,
    }

    api = APIClient()
    audrey: Any = make_user("audrey", Role.AUDITOR)
    api.force_authenticate(audrey)
    response = api.get("/api/audit/export/", {"from_sequence": exported.sequence})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/jsonl"
    data = b"".join(response.streaming_content)
    check = export_verify(data, public_key=signing_public_key())
    assert check.ok, check.problem
    assert check.events == 1  # the first download's own event
    assert orjson.loads(data.splitlines()[0])["action"] == "audit.exported"
    assert AuditEvent.objects.filter(action="audit.exported").count() == 2


def test_the_api_refuses_a_bad_range_with_a_400() -> None:
    api = APIClient()
    audrey: Any = make_user("audrey", Role.AUDITOR)
    api.force_authenticate(audrey)
    response = api.get("/api/audit/export/", {"from_sequence": "zero"})
    assert response.status_code == 400
    assert "from_sequence" in response.json()


def test_the_verify_command_checks_a_downloaded_file(
    trail: list[AuditEvent], tmp_path: Path
) -> None:
    """``manage.py audit_export_verify FILE``, run as an auditor would, in its own process."""
    seed = base64.b64encode(bytes(range(1, 33))).decode()
    with override_settings(AUDIT_EXPORT_SIGNING_KEY=seed):
        data = _export()
    good, bad = tmp_path / "audit.jsonl", tmp_path / "tampered.jsonl"
    good.write_bytes(data)
    bad.write_bytes(data.replace(b"Acme 2", b"Acme 9", 1))
    env = {**os.environ, "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY": seed}

    def verify(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "manage.py", "audit_export_verify", str(path), *extra],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    ok = verify(good)
    assert ok.returncode == 0, ok.stderr
    assert f"audit export verified: {len(data.splitlines()) - 1} events" in ok.stdout
    assert "the whole chain was intact when exported" in ok.stdout
    tampered = verify(bad)
    assert tampered.returncode == 1
    assert "audit export NOT verified: the events differ from the signed SHA-256" in (
        tampered.stderr
    )
    other_key = public_key_text(
        parse_signing_key(base64.b64encode(os.urandom(32)).decode()).public_key()
    )
    wrong = verify(good, "--public-key", other_key)
    assert wrong.returncode == 1
    assert "signed by another key" in wrong.stderr


def test_the_few_lines_of_python_in_docs_records_md_verify_an_export(
    trail: list[AuditEvent], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline check the docs give works as written, and catches a changed byte."""
    doc = (Path(REPO_ROOT) / "docs" / "records.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    data = _export()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "audit.jsonl").write_bytes(data)
    exec(code, {"TRUSTED_PUBLIC_KEY": signing_public_key()})  # noqa: S102 (the doc's own code)

    (tmp_path / "audit.jsonl").write_bytes(data.replace(b"Acme 1", b"Acme 7", 1))
    with pytest.raises(AssertionError):
        exec(code, {"TRUSTED_PUBLIC_KEY": signing_public_key()})  # noqa: S102


def test_production_requires_a_signing_key_and_refuses_a_malformed_one() -> None:
    from tests.config.test_production_settings import PRODUCTION, settings_for

    without = {k: v for k, v in PRODUCTION.items() if k != "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY"}
    with pytest.raises(RuntimeError, match="SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY must be set"):
        settings_for(without, "AUDIT_EXPORT_SIGNING_KEY")
    short = {**PRODUCTION, "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY": "c2hvcnQ="}
    with pytest.raises(RuntimeError, match="must be 32 bytes, base64"):
        settings_for(short, "AUDIT_EXPORT_SIGNING_KEY")
    seed = base64.b64encode(bytes(range(32))).decode()
    given = settings_for(
        {**PRODUCTION, "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY": seed}, "AUDIT_EXPORT_SIGNING_KEY"
    )
    assert given == {"AUDIT_EXPORT_SIGNING_KEY": seed}

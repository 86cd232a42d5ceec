"""A registered file's name is a name, not a path (issue 24, defect 14).

The name becomes part of object keys (``uploads/<tenant>/<use case>/<id>/<filename>`` in the
files bucket, ``<id>/<filename>`` in the use case's virtual bucket): a ``/`` or ``..`` in it
would reach outside the registration's folder, a control character would break logs and
headers. Registration refuses such a name with a 400 naming ``filename`` and stores nothing;
the object key built from a name is normalised too (rows written before the rule).

Real Valkey (the feasibility ledger), real sessions and API keys, the S3 endpoint's own
key-to-object resolution on the real database.
"""

from __future__ import annotations

from typing import Any

import pytest
import valkey
from hypothesis import given
from hypothesis import strategies as st

from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration
from s3endpoint.principals import Principal
from s3endpoint.registrations import _target
from scheduler.files.filenames import MAX_FILENAME_BYTES, filename_problem, object_segment
from scheduler.files.upload_events import upload_object_name
from tests.scheduler.files.test_file_registration import (
    as_key,
    as_user,
    audio,
    ledger,
    world,  # noqa: F401 — a fixture
)

pytestmark = pytest.mark.django_db

BAD_NAMES = [
    "../../globex/elsewhere/1/call.wav",
    "..",
    ".",
    "...",
    "a/b.wav",
    "/etc/passwd",
    "..\\..\\call.wav",
    "call..wav/../x",
    "call\x00.wav",
    "call\n.wav",
    "call\x7f.wav",
    "call\u202egpj.wav",  # a right-to-left override: shows as "callvaw.jpg"
    "",
    "a" * 256,
    "é" * 200,  # 200 characters, 400 bytes
]


@pytest.fixture
def live_valkey_settings(settings: Any, valkey_url: str, valkey_client: valkey.Valkey) -> Any:
    """The Django side on the test Valkey (flushed by valkey_client)."""
    settings.VALKEY_URL = valkey_url
    return settings


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_rule_refuses_paths_dots_and_control_characters(name: str) -> None:
    assert filename_problem(name) is not None


@pytest.mark.parametrize(
    "name", ["call-0001.wav", "Q3 report (final).pdf", "données.jsonl", ".env", "a" * 255]
)
def test_the_rule_takes_ordinary_names(name: str) -> None:
    assert filename_problem(name) is None
    assert object_segment(name) == name  # a good name is its own object key segment


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_object_key_never_leaves_its_registration_folder(name: str) -> None:
    key = upload_object_name("acme", "transcribe", 7, name)
    segment = key.removeprefix("uploads/acme/transcribe/7/")
    assert key.startswith("uploads/acme/transcribe/7/")
    assert "/" not in segment
    assert "\\" not in segment
    assert segment.strip(".") != ""
    assert len(segment.encode()) <= MAX_FILENAME_BYTES
    assert filename_problem(segment) is None


@given(st.text(max_size=400))
def test_every_name_folds_into_one_acceptable_segment(name: str) -> None:
    segment = object_segment(name)
    assert filename_problem(segment) is None, (name, segment)


def test_registration_refuses_a_path_as_a_filename_and_stores_nothing(
    world: dict[str, Any],  # noqa: F811
    valkey_client: valkey.Valkey,
) -> None:
    """GIVEN alice, a developer of acme, and the use case's own API key WHEN either registers
    a file whose name is a path, dot segments or holds a control character THEN 400 naming
    ``filename``; no registration, no promise in the ledger, no audit event."""
    for client in (as_user(world, "alice"), as_key(world["secret"])):
        for name in BAD_NAMES:
            response = client.post("/api/files/", audio(world, filename=name), format="json")
            assert response.status_code == 400, (name, response.content)
            assert "filename" in response.json(), (name, response.json())
    assert not FileRegistration.objects.exists()
    assert ledger(valkey_client) == set()
    assert not AuditEvent.objects.filter(action="file.register").exists()

    ordinary = as_user(world, "alice").post("/api/files/", audio(world), format="json")
    assert ordinary.status_code == 201, ordinary.content
    assert ordinary.json()["upload"]["key"] == f"{ordinary.json()['id']}/call-0001.wav"


def test_a_row_with_a_path_for_a_name_uploads_inside_its_own_folder(
    world: dict[str, Any],  # noqa: F811
) -> None:
    """GIVEN a registration stored before the rule with ``../`` in its name WHEN the S3
    endpoint resolves its key THEN the object it writes stays in the registration's folder."""
    use_case = world["use_case"]
    legacy = FileRegistration.objects.create(
        use_case=use_case,
        registered_by="tests",
        kind="audio",
        filename="../../../globex/elsewhere/1/call.wav",
        model=use_case.allowed_models.get(public_id="whisper"),
        declared_bytes=10,
        state=FileState.REGISTERED,
        estimated_tokens=10,
        promised_by=use_case.created_at,
    )
    principal = Principal(
        access_key_id="AKIA",
        secret="s",
        use_case_id=use_case.pk,
        tenant_slug="acme",
        use_case_slug="transcribe",
        credential_id=1,
    )
    target = _target(principal, f"{legacy.pk}/{legacy.filename}", for_upload=True)
    folder = f"uploads/acme/transcribe/{legacy.pk}/"
    assert target.object_name.startswith(folder)
    assert "/" not in target.object_name.removeprefix(folder)

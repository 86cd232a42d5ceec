"""The files pages and the files API's downloads: who sees which file, the live progress
partial, Range requests for the audio player, and an audit event for every listen and
download — against real object storage (SeaweedFS) and, for cancelling, a real Valkey.

Personas: audrey is an auditor, olivia an officer, alice a developer of acme, bob a developer
of globex, mallory has an account and no role. acme's ``transcribe`` has a call recording,
uploaded, transcribed in four parts and done; globex's ``elsewhere`` has one still registered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from typing import Any

import pytest
import valkey
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration, PriorityClass, SlaClass, UseCase
from governance.roles import Role
from scheduler.files.registration import file_register
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.files import (
    files_bucket,
    finish,
    make_file,
    part_done,
    start,
    upload,
    wav_bytes,
)
from testkit.records_store import RecordsStore

pytestmark = pytest.mark.django_db

AUDIO = wav_bytes(1.0)
TRANSCRIPT = b"Hello, this is acme's support line.\n"
VTT = b"WEBVTT\n\n00:00.000 --> 00:01.000\nHello, this is acme's support line.\n"


@dataclass
class World:
    transcribe: UseCase
    elsewhere: UseCase
    call: FileRegistration  # acme's, done
    other: FileRegistration  # globex's, registered
    key_secret: str
    other_key_secret: str


@pytest.fixture
def files_store(records_store: RecordsStore) -> Iterator[str]:
    with files_bucket(records_store) as bucket:
        yield bucket


@pytest.fixture
def world(files_store: str) -> World:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    whisper = make_model("whisper", capabilities=["transcription"])
    transcribe = make_use_case(acme, "transcribe", models=(whisper,))
    elsewhere = make_use_case(globex, "elsewhere", models=(whisper,))
    make_user("alice", Role.DEVELOPER, tenants=(acme,))
    make_user("bob", Role.DEVELOPER, tenants=(globex,))
    make_user("olivia", Role.OFFICER)
    make_user("audrey", Role.AUDITOR)
    make_user("mallory")
    call = upload(make_file(transcribe, whisper, "Call 0001 (Zürich).wav"), AUDIO)
    call = start(call, parts=4)
    for index in range(4):
        call = part_done(call, index)
    call = finish(
        call, {"transcript": ("transcript.txt", TRANSCRIPT), "subtitles": ("transcript.vtt", VTT)}
    )
    other = make_file(elsewhere, whisper, "globex-call.wav", registered_by="bob")
    _, key_secret = make_key(transcribe)
    _, other_key_secret = make_key(elsewhere)
    return World(transcribe, elsewhere, call, other, key_secret, other_key_secret)


def signed_in(username: str) -> Client:
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


def text(response: Any) -> str:
    return unescape(response.content.decode())


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def downloads() -> list[Any]:  # AuditEvent rows; ``after`` read as a dict
    return list(AuditEvent.objects.filter(action="file.download").order_by("sequence"))


# --- who sees what ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("username", "sees"),
    [
        ("audrey", {"Call 0001 (Zürich).wav", "globex-call.wav"}),
        ("olivia", {"Call 0001 (Zürich).wav", "globex-call.wav"}),
        ("alice", {"Call 0001 (Zürich).wav"}),
        ("bob", {"globex-call.wav"}),
    ],
)
def test_the_files_list_shows_each_role_exactly_its_files(
    world: World, username: str, sees: set[str]
) -> None:
    response = signed_in(username).get("/files/")
    assert response.status_code == 200
    table = text(response).split('<table id="files">', 1)[1].split("</table>", 1)[0]
    listed = set(re.findall(r'<a href="/files/\d+/">([^<]+)</a>', table))
    assert listed == sees


def test_a_person_without_a_role_and_an_anonymous_visitor_see_no_files(world: World) -> None:
    assert signed_in("mallory").get("/files/").status_code == 404
    assert signed_in("mallory").get(f"/files/{world.call.pk}/").status_code == 404
    anonymous = Client().get(f"/files/{world.call.pk}/original/")
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/accounts/login/")
    assert downloads() == []


def test_another_tenants_developer_gets_404_for_every_page_and_object(world: World) -> None:
    bob = signed_in("bob")
    call = world.call.pk
    for path in (
        f"/files/{call}/",
        f"/files/{call}/progress/",
        f"/files/{call}/original/",
        f"/files/{call}/outputs/transcript/",
    ):
        assert bob.get(path).status_code == 404, path
    assert bob.post(f"/files/{call}/cancel/", {"reason": "mine now"}).status_code == 404
    assert downloads() == []
    world.call.refresh_from_db()
    assert world.call.state == FileState.DONE


def test_the_list_filters_by_use_case_state_and_kind(world: World) -> None:
    audrey = signed_in("audrey")
    by_use_case = text(audrey.get(f"/files/?use_case={world.elsewhere.pk}"))
    assert "globex-call.wav" in by_use_case
    assert "Call 0001" not in by_use_case
    done = text(audrey.get("/files/?state=done"))
    assert "Call 0001 (Zürich).wav" in done
    assert "globex-call.wav" not in done
    assert "No file matches" in text(audrey.get("/files/?kind=pdf"))
    # alice may not filter on a use case she cannot see: the form refuses it, clearly.
    refused = signed_in("alice").get(f"/files/?use_case={world.elsewhere.pk}")
    assert refused.status_code == 400
    assert "Select a valid choice" in text(refused)
    assert "globex-call.wav" not in text(refused)


def test_the_detail_page_shows_registration_parts_history_and_the_audit_notice(
    world: World,
) -> None:
    page = text(signed_in("audrey").get(f"/files/{world.call.pk}/"))
    assert "recorded in the audit trail" in page
    assert '<progress class="progress progress-done" max="100" value="100"' in page
    assert "4 of 4 parts done" in page
    parts = page.split('<table id="file-parts"', 1)[1].split("</table>", 1)[0]
    assert parts.count("<tr>") == 5  # the header and four parts
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "an id appears twice on the page"
    history = page.split('<table id="file-history"', 1)[1].split("</table>", 1)[0]
    steps = re.findall(r"<code>(fileregistration\.\w+)</code>", history)
    assert steps == [
        "fileregistration.uploaded",
        "fileregistration.queued",
        "fileregistration.running",
        "fileregistration.done",
    ]
    assert (
        f'<audio controls preload="metadata" id="file-audio" src="/files/{world.call.pk}/original/"'
        in page
    )
    assert f'href="/files/{world.call.pk}/outputs/transcript/"' in page
    # Auditors read; only the tenant's developers and officers may cancel (and not a done file).
    assert "file-cancel-form" not in page


# --- downloads, audited ------------------------------------------------------------------------
def test_a_developer_downloads_the_transcript_and_the_download_is_audited(world: World) -> None:
    response = signed_in("alice").get(f"/files/{world.call.pk}/outputs/transcript/")
    assert response.status_code == 200
    assert body(response) == TRANSCRIPT
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert (
        response["Content-Disposition"] == 'attachment; filename="Call_0001_Zurich-transcript.txt"'
    )
    assert response["Content-Length"] == str(len(TRANSCRIPT))
    [event] = downloads()
    assert event.actor == "alice"
    assert event.object_id == str(world.call.pk)
    assert event.tenant_slug == "acme"
    assert event.after == {
        "object": world.call.outputs["transcript"],
        "which": "transcript",
        "bytes": len(TRANSCRIPT),
    }


def test_the_original_plays_inline_as_audio_and_each_listen_is_audited(world: World) -> None:
    audrey = signed_in("audrey")
    whole = audrey.get(f"/files/{world.call.pk}/original/")
    assert whole.status_code == 200
    assert body(whole) == AUDIO
    assert whole["Content-Type"] == "audio/wav"
    assert whole["Accept-Ranges"] == "bytes"
    assert whole["Content-Disposition"].startswith("inline;")
    vtt = audrey.get(f"/files/{world.call.pk}/outputs/subtitles/")
    assert vtt["Content-Type"] == "text/vtt; charset=utf-8"
    assert body(vtt) == VTT
    assert [(e.actor, e.after["object"]) for e in downloads()] == [
        ("audrey", world.call.source_object),
        ("audrey", world.call.outputs["subtitles"]),
    ]


def test_range_requests_answer_206_with_exactly_the_bytes_asked_for(world: World) -> None:
    olivia = signed_in("olivia")
    url = f"/files/{world.call.pk}/original/"
    size = len(AUDIO)
    middle = olivia.get(url, HTTP_RANGE="bytes=100-1123")
    assert middle.status_code == 206
    assert middle["Content-Range"] == f"bytes 100-1123/{size}"
    assert middle["Content-Length"] == "1024"
    assert body(middle) == AUDIO[100:1124]
    tail = olivia.get(url, HTTP_RANGE="bytes=-10")
    assert tail.status_code == 206
    assert body(tail) == AUDIO[-10:]
    open_ended = olivia.get(url, HTTP_RANGE=f"bytes={size - 5}-")
    assert body(open_ended) == AUDIO[-5:]
    past_end = olivia.get(url, HTTP_RANGE=f"bytes={size}-")
    assert past_end.status_code == 416
    assert past_end["Content-Range"] == f"bytes */{size}"
    several = olivia.get(url, HTTP_RANGE="bytes=0-1,5-6")  # not served piecewise: all of it
    assert several.status_code == 200
    assert body(several) == AUDIO
    assert [e.after.get("range") for e in downloads()] == [
        "100-1123",
        f"{size - 10}-{size - 1}",
        f"{size - 5}-{size - 1}",
        None,
    ]


def test_an_output_that_does_not_exist_or_a_file_not_uploaded_is_404_and_not_audited(
    world: World,
) -> None:
    olivia = signed_in("olivia")
    assert olivia.get(f"/files/{world.call.pk}/outputs/summary/").status_code == 404
    assert olivia.get(f"/files/{world.other.pk}/original/").status_code == 404
    assert downloads() == []


def test_a_range_download_streams_under_asgi(world: World) -> None:
    from django.contrib.auth import get_user_model

    async def fetch() -> tuple[int, bytes, str]:
        client = AsyncClient()
        await client.aforce_login(await get_user_model().objects.aget(username="audrey"))
        response: Any = await client.get(
            f"/files/{world.call.pk}/original/", headers={"Range": "bytes=44-"}
        )
        chunks = [chunk async for chunk in response.streaming_content]
        return response.status_code, b"".join(chunks), response["Content-Range"]

    status, content, content_range = async_to_sync(fetch)()
    assert status == 206
    assert content == AUDIO[44:]
    assert content_range == f"bytes 44-{len(AUDIO) - 1}/{len(AUDIO)}"
    assert downloads()[0].after["range"] == f"44-{len(AUDIO) - 1}"


# --- the live progress partial ----------------------------------------------------------------
def test_the_progress_partial_follows_the_database(world: World) -> None:
    from governance.models import Model

    whisper = Model.objects.get(public_id="whisper")
    running = upload(make_file(world.transcribe, whisper, "long-call.wav"), AUDIO)
    running = start(running, parts=4)
    alice = signed_in("alice")
    url = f"/files/{running.pk}/progress/"

    def partial() -> str:
        response = alice.get(url)
        assert response.status_code == 200
        assert response["Cache-Control"] == "no-store"
        return text(response)

    first = partial()
    assert 'max="100" value="0"' in first
    assert "0 of 4 parts done" in first
    assert 'data-final="false"' in first
    part_done(running, 0)
    running = part_done(running, 1)
    second = partial()
    assert 'max="100" value="50"' in second
    assert "2 of 4 parts done" in second
    assert "Outputs appear here when the job is done" in second
    part_done(running, 2)
    running = part_done(running, 3)
    finish(running, {"transcript": ("transcript.txt", TRANSCRIPT)})
    last = partial()
    assert 'max="100" value="100"' in last
    assert 'data-final="true"' in last
    assert f'href="/files/{running.pk}/outputs/transcript/"' in last
    # The detail page stops polling a file that has ended.
    assert "data-poll=" not in text(alice.get(f"/files/{running.pk}/"))


def test_a_running_files_detail_page_polls_its_partial(world: World) -> None:
    from governance.models import Model

    running = start(
        upload(make_file(world.transcribe, Model.objects.get(public_id="whisper")), AUDIO), 2
    )
    page = text(signed_in("alice").get(f"/files/{running.pk}/"))
    assert f'data-poll="/files/{running.pk}/progress/" data-poll-ms="2000"' in page


# --- cancelling, through the service that releases the promise --------------------------------
@pytest.fixture
def live_valkey(settings: Any, valkey_url: str, valkey_client: valkey.Valkey) -> valkey.Valkey:
    settings.VALKEY_URL = valkey_url
    return valkey_client


def test_a_developer_cancels_a_registered_file_from_its_page(
    world: World, live_valkey: valkey.Valkey
) -> None:
    from django.contrib.auth import get_user_model

    alice = get_user_model().objects.get(username="alice")
    hourly = SlaClass.objects.create(
        use_case=world.transcribe,
        name="hourly",
        turnaround_seconds=3600,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["audio"],
        max_file_bytes=10**9,
    )
    registered = file_register(
        actor=Actor.for_user(alice),
        use_case=world.transcribe,
        kind="audio",
        filename="tomorrow.wav",
        model=world.call.model,
        declared_bytes=16_044,
        declared_seconds=1.0,
        sla_class=hourly,
    ).file
    page = text(signed_in("audrey").get(f"/files/{registered.pk}/"))
    assert "file-cancel-form" not in page  # auditors read only
    client = signed_in("alice")
    assert "file-cancel-form" in text(client.get(f"/files/{registered.pk}/"))
    response = client.post(f"/files/{registered.pk}/cancel/", {"reason": "wrong file"}, follow=True)
    assert response.status_code == 200
    assert "is cancelled" in text(response)
    registered.refresh_from_db()
    assert registered.state == FileState.CANCELLED
    event = AuditEvent.objects.get(
        action="fileregistration.cancelled", object_id=str(registered.pk)
    )
    assert event.actor == "alice"
    assert (event.after or {}).get("reason") == "wrong file"


# --- the API ------------------------------------------------------------------------------------
def as_user(username: str) -> APIClient:
    from django.contrib.auth import get_user_model

    client = APIClient()
    client.force_login(get_user_model().objects.get(username=username))
    return client


def as_key(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_the_api_shows_progress_source_outputs_and_parts(world: World) -> None:
    response = as_user("audrey").get(f"/api/files/{world.call.pk}/")
    assert response.status_code == 200
    data = response.json()
    assert data["state"] == "done"
    assert data["progress"] == 1.0
    assert data["source"]["bytes"] == len(AUDIO)
    assert len(data["source"]["sha256"]) == 64
    assert data["outputs"] == ["subtitles", "transcript"]
    assert data["parts"] == {"total": 4, "done": 4, "running": 0, "failed": 0, "pending": 0}
    assert data["uploaded_at"]
    assert data["failure"] == ""
    listed = as_user("alice").get("/api/files/").json()["results"]
    assert [row["parts"]["done"] for row in listed] == [4]
    other = as_user("audrey").get(f"/api/files/{world.other.pk}/").json()
    assert other["source"] is None
    assert other["outputs"] == []


def test_the_use_cases_own_key_downloads_via_the_api_and_is_audited_as_the_key(
    world: World,
) -> None:
    client = as_key(world.key_secret)
    response = client.get(
        f"/api/files/{world.call.pk}/original/", HTTP_RANGE="bytes=0-43", HTTP_ACCEPT="audio/*"
    )
    assert response.status_code == 206
    assert body(response) == AUDIO[:44]
    transcript = client.get(f"/api/files/{world.call.pk}/outputs/transcript/")
    assert transcript.status_code == 200
    assert body(transcript) == TRANSCRIPT
    actors = {e.actor for e in downloads()}
    assert len(actors) == 1
    assert actors.pop().startswith("key:sk-sy-")


@pytest.mark.parametrize("who", ["bob", "other-key"])
def test_the_api_hides_another_tenants_or_use_cases_objects(world: World, who: str) -> None:
    client = as_key(world.other_key_secret) if who == "other-key" else as_user("bob")
    for path, accept in (
        ("original/", "audio/*"),
        ("outputs/transcript/", "*/*"),
        ("", "application/json"),
    ):
        response = client.get(f"/api/files/{world.call.pk}/{path}", HTTP_ACCEPT=accept)
        assert response.status_code == 404, path
        assert response.json()["detail"]
    assert downloads() == []


def test_the_api_answers_a_missing_output_with_json_404(world: World) -> None:
    response = as_user("olivia").get(f"/api/files/{world.call.pk}/outputs/summary/")
    assert response.status_code == 404
    assert "no output named 'summary'" in response.json()["detail"]


def test_an_object_gone_from_the_bucket_is_404_and_not_audited(world: World) -> None:
    from django.core.files.storage import storages

    storages["files"].delete(world.call.outputs["transcript"])
    assert signed_in("olivia").get(f"/files/{world.call.pk}/outputs/transcript/").status_code == 404
    assert downloads() == []


def test_a_failed_file_says_why_and_stops_polling(world: World) -> None:
    from governance.models import Model
    from scheduler.files.states import file_failed

    running = start(
        upload(make_file(world.transcribe, Model.objects.get(public_id="whisper")), AUDIO), 2
    )
    file_failed(
        actor=Actor.system("file-jobs"), registration=running, failure="The audio is unreadable."
    )
    partial = text(signed_in("alice").get(f"/files/{running.pk}/progress/"))
    assert 'data-final="true"' in partial
    assert "Failed: The audio is unreadable." in partial
    assert "This file ended without outputs." in partial
    api = as_user("alice").get(f"/api/files/{running.pk}/").json()
    assert api["failure"] == "The audio is unreadable."
    assert api["parts"]["pending"] == 2


def test_a_developer_without_files_is_told_so(world: World) -> None:
    from testkit.factories import make_tenant as tenant

    make_user("carol", Role.DEVELOPER, tenants=(tenant("initech"),))
    page = text(signed_in("carol").get("/files/"))
    assert "No files are registered that you may see." in page


def test_the_use_case_page_links_to_its_files(world: World) -> None:
    page = text(signed_in("alice").get(f"/use-cases/{world.transcribe.pk}/"))
    assert f'href="/files/?use_case={world.transcribe.pk}" id="use-case-files"' in page


def test_the_filesystem_backend_serves_ranges_too(world: World, tmp_path: Any) -> None:
    """The smallest installs keep objects on disk (SWITCHYARD_OBJECT_STORAGE=filesystem)."""
    from django.conf import settings
    from django.test import override_settings

    on_disk = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path), "allow_overwrite": True},
    }
    with override_settings(STORAGES={**settings.STORAGES, "files": on_disk}):
        (tmp_path / "uploads").mkdir()
        (tmp_path / "uploads" / "call.wav").write_bytes(AUDIO)
        FileRegistration.objects.filter(pk=world.call.pk).update(source_object="uploads/call.wav")
        olivia = signed_in("olivia")
        part = olivia.get(f"/files/{world.call.pk}/original/", HTTP_RANGE="bytes=1000-70000")
        assert part.status_code == 206
        assert body(part) == AUDIO[1000:]
        assert part["Content-Range"] == f"bytes 1000-{len(AUDIO) - 1}/{len(AUDIO)}"
        (tmp_path / "uploads" / "call.wav").unlink()
        assert olivia.get(f"/files/{world.call.pk}/original/").status_code == 404
    assert len(downloads()) == 1

"""File registrations for the portal's and the API's tests: a files bucket of the test's own on
the session's SeaweedFS, a real WAV, and a file moved through its states the way the upload
endpoint and the job runner move it (``scheduler.files.states``), not by writing ``state``.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import struct
import uuid
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.test import override_settings
from django.utils import timezone

from governance.audit import Actor
from governance.models import FileRegistration, Model, UseCase
from scheduler.files.states import (
    file_done,
    file_progress,
    file_queued,
    file_started,
    file_uploaded,
)
from scheduler.files.upload_events import upload_object_name
from scheduler.models import FilePart, PartState
from testkit.records_store import RecordsStore

RUNNER = Actor.system("file-jobs")


@contextmanager
def files_bucket(records_store: RecordsStore) -> Iterator[str]:
    """``storages["files"]`` on a fresh bucket of the session's SeaweedFS (beside the records
    bucket ``records_store`` makes), created, so that objects can be written into it."""
    bucket = re.sub(r"^t-", "f-", records_store.bucket)
    records_store.client().create_bucket(Bucket=bucket)
    options = dict(settings.STORAGES["records"]["OPTIONS"])  # type: ignore[call-overload]
    options["bucket_name"] = bucket
    files = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options}
    with override_settings(STORAGES={**settings.STORAGES, "files": files}, FILES_BUCKET=bucket):
        yield bucket


def wav_bytes(seconds: float = 1.0, rate: int = 8000) -> bytes:
    """A mono 16-bit WAV of a 440 Hz tone: something a browser's audio element really plays."""
    frames = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
        for i in range(int(seconds * rate))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames)
    return buffer.getvalue()


def make_file(
    use_case: UseCase, model: Model, filename: str = "call-0001.wav", **fields: Any
) -> FileRegistration:
    """A registration as file_register stores it, without asking the feasibility model."""
    now = timezone.now()
    defaults: dict[str, Any] = {
        "registered_by": "alice",
        "kind": "audio",
        "declared_bytes": 16_044,
        "declared_seconds": 1.0,
        "estimated_tokens": 25,
        "promised_by": now + timedelta(hours=1),
        "deadline": now + timedelta(hours=2),
    }
    return FileRegistration.objects.create(
        use_case=use_case, model=model, filename=filename, **{**defaults, **fields}
    )


def write_object(name: str, content: bytes) -> str:
    """Put ``content`` at exactly ``name`` in the files bucket (names are deterministic)."""
    saved = storages["files"].save(name, ContentFile(content))
    assert saved == name, f"the storage renamed {name} to {saved}"
    return name


def upload(file: FileRegistration, content: bytes) -> FileRegistration:
    """What the S3 endpoint does: the object in the bucket, then the registration uploaded."""
    name = upload_object_name(
        file.use_case.tenant.slug, file.use_case.slug, file.pk, f"{uuid.uuid4().hex[:6]}.bin"
    )
    write_object(name, content)
    return file_uploaded(
        actor=Actor.system("s3-endpoint"),
        registration=file,
        uploaded_at=timezone.now(),
        source_object=name,
        source_bytes=len(content),
        source_sha256=hashlib.sha256(content).hexdigest(),
    )


def start(file: FileRegistration, parts: int) -> FileRegistration:
    """Queued, running, and planned into ``parts`` pending parts."""
    file = file_queued(actor=RUNNER, registration=file)
    file = file_started(actor=RUNNER, registration=file)
    FilePart.objects.bulk_create(
        FilePart(registration=file, index=i, spec={"seconds": [i, i + 1]}) for i in range(parts)
    )
    return file


def part_done(file: FileRegistration, index: int, tokens: int = 40) -> FileRegistration:
    """One part finished; progress is the share of parts done (as the job runner reports)."""
    FilePart.objects.filter(registration=file, index=index).update(
        state=PartState.DONE, attempts=1, tokens=tokens, finished_at=timezone.now()
    )
    total = FilePart.objects.filter(registration=file).count()
    done = FilePart.objects.filter(registration=file, state=PartState.DONE).count()
    return file_progress(registration=file, progress=done / total)


def finish(file: FileRegistration, outputs: dict[str, tuple[str, bytes]]) -> FileRegistration:
    """``outputs``: output name → (object file name, content), written beside the original."""
    folder = file.source_object.rsplit("/", 1)[0]
    names = {
        output: write_object(f"{folder}/out/{object_file}", content)
        for output, (object_file, content) in outputs.items()
    }
    return file_done(actor=RUNNER, registration=file, outputs=names)

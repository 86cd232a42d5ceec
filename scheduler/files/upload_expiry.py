"""Abandoned multipart uploads, aborted once they are old (docs/files.md, "The S3 endpoint").

A client that starts a multipart upload through the S3 endpoint and never completes nor aborts
it leaves its parts in the files bucket, where nothing reads them, and its registration marked
as being uploaded (``mp:<upload id>``), so no other upload is accepted for it. Beat runs
``multipart_uploads_expire`` (scheduler/schedules.py): it lists the bucket's unfinished uploads
of originals (``uploads/``), aborts those started more than
``SWITCHYARD_S3_MULTIPART_MAX_AGE_SECONDS`` ago, and gives the registration's marker back if it
still names that upload, so the file may be uploaded again. At most ``MAX_PER_RUN`` per run;
the rest wait for the next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import valkey
from django.conf import settings
from django.core.files.storage import Storage, storages
from django.utils import timezone
from storages.backends.s3 import S3Storage

from governance.store import valkey_client
from scheduler.files.upload_events import (
    MULTIPART_MARKER_PREFIX,
    UPLOADS_PREFIX,
    upload_marker_key,
    upload_parts_key,
    upload_registration_id,
)

logger = logging.getLogger(__name__)

MAX_PER_RUN = 1000
_RELEASE_LUA = (Path(__file__).resolve().parent / "upload_release.lua").read_text()


@dataclass
class ExpiryReport:
    aborted: int = 0
    released: int = 0  # registrations whose marker named an aborted upload
    kept: int = 0  # unfinished uploads younger than the age

    def as_dict(self) -> dict[str, int]:
        return {"aborted": self.aborted, "released": self.released, "kept": self.kept}


def multipart_uploads_expire(
    *,
    now: datetime | None = None,
    max_age: float | None = None,
    client: valkey.Valkey | None = None,
    storage: Storage | None = None,
) -> ExpiryReport:
    """Abort the files bucket's multipart uploads older than ``max_age`` seconds (the
    setting's by default) and free their registrations."""
    storage = storage if storage is not None else storages["files"]
    report = ExpiryReport()
    if not isinstance(storage, S3Storage):
        return report  # a filesystem store has no multipart uploads
    age = settings.S3_MULTIPART_MAX_AGE_SECONDS if max_age is None else max_age
    cutoff = (now or timezone.now()) - timedelta(seconds=age)
    s3: Any = storage.connection.meta.client
    bucket = storage.bucket_name
    release = (client or valkey_client()).register_script(_RELEASE_LUA)
    pages = s3.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, Prefix=UPLOADS_PREFIX
    )
    for page in pages:
        for upload in page.get("Uploads", []):
            if report.aborted >= MAX_PER_RUN:
                return report
            if upload["Initiated"] > cutoff:
                report.kept += 1
                continue
            key, upload_id = upload["Key"], upload["UploadId"]
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            report.aborted += 1
            registration_id = upload_registration_id(key)
            if registration_id is not None and release(
                keys=[upload_marker_key(registration_id), upload_parts_key(registration_id)],
                args=[MULTIPART_MARKER_PREFIX + upload_id],
            ):
                report.released += 1
            logger.info(
                "multipart_upload_expired key=%s upload=%s initiated=%s",
                key,
                upload_id,
                upload["Initiated"].isoformat(),
            )
    return report

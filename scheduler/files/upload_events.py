"""The event a completed upload emits, and the stream it goes to (the talk used Kafka).

The S3 endpoint (s3endpoint/) appends one entry to ``sy:uploads`` when an object of a
registered file is complete (a PUT, or a multipart upload's CompleteMultipartUpload); the
``/v1/files`` + ``/v1/batches`` door appends the same event for a batch's input. A Celery
consumer (scheduler/files/jobs.py) reads the stream with a consumer group, matches each event to
its registration (``file_uploaded``) and queues its job. At-least-once: an event seen twice
finds the registration already uploaded and is only acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.files.filenames import object_segment

UPLOADS_STREAM = "sy:uploads"
UPLOADS_GROUP = "file-jobs"
# Bounded: a consumer that is down for long keeps this many events, far more than the
# registrations that can be waiting (each has a deadline).
UPLOADS_MAXLEN = 100_000


@dataclass(frozen=True, slots=True)
class UploadEvent:
    registration_id: int
    object_name: str  # in the files bucket (settings.FILES_BUCKET), not the virtual bucket
    size: int
    sha256: str  # hex; "" when the uploader's protocol gave none (multipart)
    etag: str
    uploader: str  # "s3:<access key id>", "key:<prefix>"
    uploaded_at: float  # epoch seconds

    def fields(self) -> dict[str, str]:
        return {
            "registration": str(self.registration_id),
            "object": self.object_name,
            "bytes": str(self.size),
            "sha256": self.sha256,
            "etag": self.etag,
            "uploader": self.uploader,
            "at": repr(self.uploaded_at),
        }

    @classmethod
    def parse(cls, fields: dict[bytes, bytes]) -> UploadEvent:
        """Raises ValueError (or KeyError) on an entry that is not an upload event."""
        text = {k.decode(): v.decode() for k, v in fields.items()}
        return cls(
            registration_id=int(text["registration"]),
            object_name=text["object"],
            size=int(text["bytes"]),
            sha256=text.get("sha256", ""),
            etag=text.get("etag", ""),
            uploader=text.get("uploader", ""),
            uploaded_at=float(text["at"]),
        )


UPLOADS_PREFIX = "uploads/"
# The S3 endpoint's per-registration keys (s3endpoint/markers.py), here because the multipart
# expiry (scheduler/files/upload_expiry.py) gives them back too. The hash tag puts them in the
# stream's slot on a Valkey Cluster, so the endpoint's completion stays one MULTI.
UPLOADS_SLOT_TAG = "{" + UPLOADS_STREAM + "}"
MULTIPART_MARKER_PREFIX = "mp:"


def upload_marker_key(registration_id: int) -> str:
    """``put`` / ``mp:<upload id>`` / ``done``: the one upload a registration may have."""
    return f"sy:s3:upload:{UPLOADS_SLOT_TAG}:{registration_id}"


def upload_parts_key(registration_id: int) -> str:
    """A multipart upload's part sizes (part number → bytes), reserved as parts arrive."""
    return f"sy:s3:parts:{UPLOADS_SLOT_TAG}:{registration_id}"


def upload_object_name(tenant: str, use_case: str, registration_id: int, filename: str) -> str:
    """Where an uploaded original lives in the files bucket: one folder per registration, so
    outputs sit beside it (``…/<id>/out/…``) and a registration's objects go together. The
    name is one segment, whatever a row holds (scheduler/files/filenames.py)."""
    return f"{UPLOADS_PREFIX}{tenant}/{use_case}/{registration_id}/{object_segment(filename)}"


def upload_registration_id(object_name: str) -> int | None:
    """The registration an original's object name belongs to; None for any other name."""
    parts = object_name.split("/", 4)
    if len(parts) != 5 or parts[0] + "/" != UPLOADS_PREFIX or not parts[3].isdigit():
        return None
    return int(parts[3])


def publish_upload(client: object, event: UploadEvent) -> bytes:
    """Append ``event`` to the uploads stream; returns the entry id. ``client`` is a
    ``valkey.Valkey`` (sync) — the async endpoint uses ``valkey.asyncio`` with ``fields()``."""
    return client.xadd(  # type: ignore[attr-defined, no-any-return]
        UPLOADS_STREAM, event.fields(), maxlen=UPLOADS_MAXLEN, approximate=True
    )

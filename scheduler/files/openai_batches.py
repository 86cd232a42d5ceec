"""Batches of the OpenAI Batch API (``/v1/batches``): a file registration of kind "batch"
whose input is already stored (docs/files.md, "The OpenAI Batch API").

``batch_create`` maps OpenAI's only completion window, "24h", to the use case's SLA class for
batch files with the longest turnaround of at most a day, registers the file through
``scheduler.files.registration.file_register`` (so the feasibility model answers, at once,
exactly as for any other file), and — the input being in the files bucket already — publishes
its upload event at once: the file-jobs consumer takes it from there as it takes an S3 upload.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import valkey
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from governance.audit import Actor
from governance.choices import FileKind, FileState
from governance.models import (
    ApiFile,
    ApiKey,
    AuditEvent,
    FileRegistration,
    SlaClass,
    UseCase,
)
from governance.store import valkey_client
from scheduler.files.filenames import object_segment
from scheduler.files.openai_files import (
    BATCH_ENDPOINTS,
    PURPOSE_BATCH,
    InvalidRequest,
    apifile_get,
    batch_input_summary,
)
from scheduler.files.registration import Registered, file_cancel, file_register
from scheduler.files.states import FINAL_STATES
from scheduler.files.upload_events import UploadEvent, publish_upload

COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512

# A registration's state → the batch status OpenAI's clients know.
STATUS: dict[str, str] = {
    FileState.REGISTERED: "validating",
    FileState.UPLOADED: "validating",
    FileState.QUEUED: "validating",
    FileState.RUNNING: "in_progress",
    FileState.DONE: "completed",
    FileState.FAILED: "failed",
    FileState.EXPIRED: "expired",
    FileState.CANCELLED: "cancelled",
}


class StoreUnavailable(Exception):
    """The upload event could not be published; the batch was withdrawn (503)."""


@dataclass(frozen=True)
class BatchRequest:
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str]


def batch_request(data: Any) -> BatchRequest:
    """Parse a create body into a typed request; InvalidRequest names the field that is wrong."""
    if not isinstance(data, dict):
        raise InvalidRequest("The body must be a JSON object.")
    input_file_id = data.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise InvalidRequest("input_file_id must name an uploaded file.", param="input_file_id")
    endpoint = data.get("endpoint")
    if endpoint not in BATCH_ENDPOINTS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(BATCH_ENDPOINTS)}.", param="endpoint"
        )
    window = data.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise InvalidRequest('completion_window must be "24h".', param="completion_window")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidRequest(
            f"metadata must be an object of at most {MAX_METADATA_PAIRS} pairs.", param="metadata"
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(value, str):
            raise InvalidRequest(
                f"metadata keys are at most {MAX_METADATA_KEY} characters and values strings.",
                param="metadata",
            )
        if len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(
                f"metadata values are at most {MAX_METADATA_VALUE} characters.", param="metadata"
            )
    return BatchRequest(input_file_id, endpoint, window, dict(metadata))


def batch_sla_class(use_case: UseCase, window_seconds: int) -> SlaClass:
    """The use case's SLA class for batch files with the longest turnaround within the window."""
    fitting = [
        sla
        for sla in SlaClass.objects.filter(use_case=use_case)
        if FileKind.BATCH in sla.kinds
        and sla.turnaround_seconds is not None
        and sla.turnaround_seconds <= window_seconds
    ]
    if not fitting:
        raise InvalidRequest(
            f"The use case has no SLA class for batch files that finishes within "
            f"{window_seconds // 3600} hours: a governance officer must add one (kinds "
            f'including "batch", turnaround_seconds at most {window_seconds}).',
            param="completion_window",
        )
    return max(fitting, key=lambda sla: (sla.turnaround_seconds or 0, -sla.pk))


def batch_create(
    *, actor: Actor, use_case: UseCase, api_key: ApiKey | None, request: BatchRequest
) -> FileRegistration:
    """Register the batch (or raise scheduler.files.registration.Infeasible, nothing stored)
    and hand its input to the file jobs."""
    try:
        input_file = apifile_get(use_case_id=use_case.pk, public_id=request.input_file_id)
    except ApiFile.DoesNotExist:
        raise InvalidRequest(
            f"No file with id {request.input_file_id!r}.", param="input_file_id"
        ) from None
    if input_file.purpose != PURPOSE_BATCH:
        raise InvalidRequest(
            f'The file {input_file.public_id} has purpose "{input_file.purpose}", not "batch".',
            param="input_file_id",
        )
    summary = batch_input_summary(input_file)
    if summary.url != request.endpoint:
        raise InvalidRequest(
            f"The file's requests are for {summary.url}, not {request.endpoint}.",
            param="endpoint",
        )
    # A line may name a version or an alias (model@v2): the grant is the model's.
    model = use_case.allowed_models.filter(public_id=summary.model.partition("@")[0]).first()
    if model is None:  # the use case lost the model since the upload
        raise InvalidRequest(
            f"The use case may no longer use the model {summary.model!r}.", param="input_file_id"
        )
    sla = batch_sla_class(use_case, COMPLETION_WINDOWS[request.completion_window])
    try:
        registered: Registered = file_register(
            actor=actor,
            use_case=use_case,
            kind=FileKind.BATCH,
            # The upload's own name, as one segment: a batch is not refused for its file's name.
            filename=object_segment(input_file.filename),
            model=model,
            declared_bytes=max(input_file.bytes, 1),
            declared_lines=summary.lines,
            sla_class=sla,
            api_key=api_key,
        )
    except ValidationError as exc:
        raise InvalidRequest(" ".join(exc.messages), param="input_file_id") from exc
    batch = registered.file
    FileRegistration.objects.filter(pk=batch.pk).update(
        input_file=input_file,
        request_endpoint=request.endpoint,
        metadata=request.metadata,
        counts={"total": summary.lines, "completed": 0, "failed": 0},
        source_object=input_file.object_name,
        source_bytes=input_file.bytes,
        source_sha256=input_file.sha256,
    )
    batch.refresh_from_db()
    event = UploadEvent(
        registration_id=batch.pk,
        object_name=input_file.object_name,
        size=input_file.bytes,
        sha256=input_file.sha256,
        etag="",
        uploader=f"key:{api_key.prefix}" if api_key is not None else actor.username,
        uploaded_at=time.time(),
    )
    try:
        publish_upload(valkey_client(), event)
    except valkey.ValkeyError as exc:
        # Nobody would ever run it: withdraw the batch (and its promise) rather than leave it
        # validating until it expires.
        # Valkey is down: the promise's release fails too, and it lapses with its deadline.
        with contextlib.suppress(valkey.ValkeyError):
            file_cancel(
                actor=Actor.system("batch-api"), file=batch, reason="upload event not published"
            )
        raise StoreUnavailable(str(exc)) from exc
    return batch


def batch_cancel(
    *, actor: Actor, api_key: ApiKey | None, batch: FileRegistration
) -> tuple[FileRegistration, str]:
    """Cancel a batch that has not ended; the status to answer: "cancelling" while parts may
    still be in flight (it was running), else "cancelled"."""
    was = batch.state
    batch = file_cancel(
        actor=actor, file=batch, api_key=api_key, reason="cancelled via /v1/batches"
    )
    return batch, "cancelling" if was == FileState.RUNNING else "cancelled"


def batches_of(use_case_id: int) -> QuerySet[FileRegistration]:
    return FileRegistration.objects.filter(
        use_case_id=use_case_id, kind=FileKind.BATCH, input_file__isnull=False
    ).select_related("input_file", "model")


def batch_get(*, use_case_id: int, batch_id: str) -> FileRegistration:
    """One batch of the use case; FileRegistration.DoesNotExist otherwise."""
    prefix, _, number = batch_id.partition("_")
    if prefix != "batch" or not number.isdigit():
        raise FileRegistration.DoesNotExist
    return batches_of(use_case_id).get(pk=int(number))


def batches_started_at(batches: Sequence[FileRegistration]) -> dict[int, datetime]:
    """When each ended batch started running, from the audit trail: the row keeps only its
    current state's time. One query for a page of batches."""
    ended = [str(b.pk) for b in batches if b.state in FINAL_STATES]
    if not ended:
        return {}
    rows = AuditEvent.objects.filter(
        action=f"fileregistration.{FileState.RUNNING}",
        object_type=FileRegistration._meta.label_lower,
        object_id__in=ended,
    ).values_list("object_id", "occurred_at")
    return {int(pk): at for pk, at in rows}


def _epoch(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def batch_object(
    batch: FileRegistration, *, status: str | None = None, started_at: datetime | None = None
) -> dict[str, Any]:
    """The OpenAI batch object: the current state's time is ``state_changed_at``; an ended
    batch's ``in_progress_at`` is ``started_at`` (batches_started_at)."""
    state = batch.state
    changed = batch.state_changed_at

    def at(step: str) -> int | None:
        return _epoch(changed) if state == step else None

    counts = batch.counts or {}
    outputs = batch.outputs or {}
    errors = None
    if state == FileState.FAILED:
        errors = {
            "object": "list",
            "data": [
                {"code": "batch_failed", "message": batch.failure, "param": None, "line": None}
            ],
        }
    return {
        "id": f"batch_{batch.pk}",
        "object": "batch",
        "endpoint": batch.request_endpoint,
        "model": batch.model.public_id,
        "errors": errors,
        "input_file_id": batch.input_file.public_id if batch.input_file else None,
        "completion_window": "24h",
        "status": status or STATUS.get(state, "validating"),
        "output_file_id": outputs.get("output_file_id"),
        "error_file_id": outputs.get("error_file_id"),
        "created_at": _epoch(batch.created_at),
        "in_progress_at": at(FileState.RUNNING) or _epoch(started_at),
        "expires_at": _epoch(batch.promised_by),
        "finalizing_at": None,
        "completed_at": at(FileState.DONE),
        "failed_at": at(FileState.FAILED),
        "expired_at": at(FileState.EXPIRED),
        "cancelling_at": None,
        "cancelled_at": at(FileState.CANCELLED),
        "request_counts": {
            "total": int(counts.get("total", batch.declared_lines or 0)),
            "completed": int(counts.get("completed", 0)),
            "failed": int(counts.get("failed", 0)),
        },
        "metadata": batch.metadata or None,
    }


__all__ = [
    "BatchRequest",
    "StoreUnavailable",
    "batch_cancel",
    "batch_create",
    "batch_get",
    "batch_object",
    "batch_request",
    "batches_of",
    "batches_started_at",
]

"""Files of the OpenAI Files API (``/v1/files``): a batch's input, checked line by line at
upload, and the output and error files a batch leaves (docs/files.md, "The OpenAI Batch API").

A file belongs to one use case: only that use case's keys see it (another's get 404, as for
a file that does not exist). Its bytes live in the files bucket (``STORAGES["files"]``) under
``apifiles/<tenant>/<use case>/<public id>/<filename>``; the row keeps their size and SHA-256.
A batch input is refused at upload, with the lines named, unless every line is a request the
use case may make, so a batch that is accepted later runs only requests that can succeed.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson
from django.conf import settings
from django.core.files.base import File
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from governance import model_routing
from governance.audit import Actor, audit_record, object_state
from governance.choices import Capability
from governance.errors import Conflict
from governance.models import ApiFile, ApiKey, FileRegistration, UseCase
from records.objects import ensure_bucket
from scheduler.files.states import FINAL_STATES

PURPOSE_BATCH = "batch"
PURPOSE_OUTPUT = "batch_output"
PURPOSE_ERROR = "batch_error"
PURPOSES = (PURPOSE_BATCH, PURPOSE_OUTPUT, PURPOSE_ERROR)
# The endpoints a batch line may name, and the capability its model needs for each.
BATCH_ENDPOINTS: dict[str, str] = {
    "/v1/chat/completions": Capability.CHAT,
    "/v1/completions": Capability.COMPLETIONS,
    "/v1/embeddings": Capability.EMBEDDINGS,
}
MAX_REPORTED_ERRORS = 20  # enough to fix a file generator; the count says how many more
CHUNK_BYTES = 256 * 1024


class InvalidRequest(Exception):
    """A request the files and batch API refuse as asked (400), naming the parameter."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BatchInputInvalid(Exception):
    """The uploaded JSONL is not a batch the use case can run; each problem names its line."""

    def __init__(self, problems: list[str], more: int = 0) -> None:
        self.problems = problems
        tail = f" (and {more} more)" if more else ""
        super().__init__("; ".join(problems) + tail)


@dataclass(frozen=True)
class BatchInput:
    """What a valid batch input holds: its request count, and the one endpoint and model."""

    lines: int
    url: str
    model: str


def _problem(line: int, text: str) -> str:
    return f"line {line}: {text}"


def batch_input_check(
    lines: Iterable[bytes], *, models: dict[str, frozenset[str]], max_lines: int
) -> BatchInput:
    """Check every line of a batch input (``models``: the use case's model → capabilities).

    Blank lines are skipped (an editor's final newline); each other line must be a JSON object
    with a unique ``custom_id``, ``method`` POST, a ``url`` of BATCH_ENDPOINTS and a ``body``
    object whose ``model`` the use case may call with that endpoint; all lines one url, one
    model. Raises BatchInputInvalid listing the first problems."""
    problems: list[str] = []
    more = 0
    seen: set[str] = set()
    url = model = ""
    count = 0

    def report(line: int, text: str) -> None:
        nonlocal more
        if len(problems) < MAX_REPORTED_ERRORS:
            problems.append(_problem(line, text))
        else:
            more += 1

    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        count += 1
        if count > max_lines:
            report(number, f"a batch holds at most {max_lines} requests")
            break
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            report(number, "not valid JSON")
            continue
        if not isinstance(item, dict):
            report(number, "not a JSON object")
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            report(number, "custom_id must be a non-empty string")
        elif custom_id in seen:
            report(number, f"custom_id {custom_id!r} is used by an earlier line")
        else:
            seen.add(custom_id)
        if item.get("method") != "POST":
            report(number, 'method must be "POST"')
        line_url = item.get("url")
        if line_url not in BATCH_ENDPOINTS:
            report(number, f"url must be one of {', '.join(BATCH_ENDPOINTS)}")
            line_url = None
        elif url and line_url != url:
            report(number, f"url {line_url} differs from the first line's {url}")
        elif not url:
            url = line_url
        body = item.get("body")
        if not isinstance(body, dict):
            report(number, "body must be a JSON object")
            continue
        line_model = body.get("model")
        if not isinstance(line_model, str) or not line_model:
            report(number, "body.model must name a model")
            continue
        if line_model not in models:
            report(number, f"the use case may not use the model {line_model!r}")
        elif line_url is not None and BATCH_ENDPOINTS[line_url] not in models[line_model]:
            report(number, f"the model {line_model!r} does not serve {line_url}")
        if model and line_model != model:
            report(number, f"model {line_model!r} differs from the first line's {model!r}")
        elif not model:
            model = line_model
    if not count:
        problems.append("the file holds no requests")
    if problems:
        raise BatchInputInvalid(problems, more)
    return BatchInput(lines=count, url=url, model=model)


def _lines(stream: IO[bytes], digest: Any = None) -> Iterator[bytes]:
    """The stream's lines, read in chunks (an uploaded file may be hundreds of megabytes),
    each chunk also fed to ``digest`` if given (one pass for the check and the hash)."""
    rest = b""
    while chunk := stream.read(CHUNK_BYTES):
        if digest is not None:
            digest.update(chunk)
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def use_case_models(use_case: UseCase) -> dict[str, frozenset[str]]:
    """What a batch line may name: the use case's models, and each version and alias of
    those that have versions (``model@v2``, ``model@stable``; docs/models.md)."""
    models: dict[str, frozenset[str]] = {}
    for model in use_case.allowed_models.all():
        capabilities = frozenset(model.capabilities)
        models[model.public_id] = capabilities
        for label in model_routing.targets(model.routing or {}, model.versions()):
            models[f"{model.public_id}@{label}"] = capabilities
    return models


def files_storage() -> Storage:
    return storages["files"]


def _public_id() -> str:
    return "file-" + secrets.token_hex(12)


def apifile_create(
    *,
    actor: Actor,
    use_case: UseCase,
    api_key: ApiKey | None,
    upload: File[Any],
    filename: str,
    purpose: str,
) -> tuple[ApiFile, BatchInput]:
    """Check and store an uploaded batch input for the use case (its key's, or the one a
    service account is bound to); audited."""
    if purpose != PURPOSE_BATCH:
        raise InvalidRequest(
            f'purpose must be "{PURPOSE_BATCH}" (the only one Switchyard serves)', param="purpose"
        )
    size = upload.size or 0
    if size > settings.BATCH_MAX_FILE_BYTES:
        raise InvalidRequest(
            f"The file is larger than {settings.BATCH_MAX_FILE_BYTES} bytes.", param="file"
        )
    digest = hashlib.sha256()
    upload.seek(0)
    summary = batch_input_check(
        _lines(upload, digest),
        models=use_case_models(use_case),
        max_lines=settings.BATCH_MAX_LINES,
    )
    upload.seek(0)
    public_id = _public_id()
    name = f"apifiles/{use_case.tenant.slug}/{use_case.slug}/{public_id}/{_safe_name(filename)}"
    storage = files_storage()
    ensure_bucket(storage)  # once per process: the files bucket may not exist yet
    stored = storage.save(name, upload)
    with transaction.atomic():
        file = ApiFile.objects.create(
            public_id=public_id,
            use_case=use_case,
            api_key=api_key,
            purpose=purpose,
            filename=filename[:255],
            bytes=size,
            sha256=digest.hexdigest(),
            object_name=stored,
        )
        audit_record(
            actor=actor,
            action="apifile.create",
            obj=file,
            after={**object_state(file), "lines": summary.lines, "model": summary.model},
            tenant_slug=use_case.tenant.slug,
            tenant_id=use_case.tenant_id,
        )
    return file, summary


def _safe_name(filename: str) -> str:
    """The last path segment, without characters an object name should not carry."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1].strip() or "input.jsonl"
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[:200]
    return cleaned if cleaned.strip(".") else "input.jsonl"  # never "." or ".."


def apifiles_of(use_case_id: int) -> QuerySet[ApiFile]:
    """The files a use case's keys may see (not deleted), newest first."""
    return ApiFile.objects.filter(use_case_id=use_case_id, deleted_at__isnull=True)


def apifile_get(*, use_case_id: int, public_id: str) -> ApiFile:
    """One file of the use case; ApiFile.DoesNotExist for another's, a deleted or no file."""
    return apifiles_of(use_case_id).get(public_id=public_id)


def apifile_delete(*, actor: Actor, file: ApiFile) -> ApiFile:
    """Mark the file deleted (its bytes stay for the audit trail's sake); refused while a batch
    that has not ended reads it."""
    live = FileRegistration.objects.filter(input_file=file).exclude(state__in=FINAL_STATES)
    if live.exists():
        ids = ", ".join(f"batch_{pk}" for pk in live.values_list("pk", flat=True)[:5])
        raise Conflict(f"The file is the input of a batch that has not ended ({ids}).")
    with transaction.atomic():
        moved = ApiFile.objects.filter(pk=file.pk, deleted_at__isnull=True).update(
            deleted_at=timezone.now()
        )
        if not moved:
            raise ApiFile.DoesNotExist
        audit_record(
            actor=actor,
            action="apifile.delete",
            obj=file,
            before=object_state(file),
            tenant_slug=file.use_case.tenant.slug,
            tenant_id=file.use_case.tenant_id,
        )
    file.refresh_from_db()
    return file


def apifile_chunks(file: ApiFile) -> Iterator[bytes]:
    """The file's bytes, chunk by chunk from the files bucket; the object is always closed."""
    stream = files_storage().open(file.object_name, "rb")
    try:
        while chunk := stream.read(CHUNK_BYTES):
            yield chunk
    finally:
        stream.close()


def apifile_download(*, actor: Actor, file: ApiFile) -> Iterator[bytes]:
    """Audit a read of the file's content (who, which file, its tenant), then hand back its
    chunks. The event is written before the first byte is sent, so a download the client
    cuts short is on the trail as much as a whole one."""
    audit_record(
        actor=actor,
        action="apifile.download",
        obj=file,
        after={
            "file": file.public_id,
            "purpose": file.purpose,
            "object": file.object_name,
            "bytes": file.bytes,
        },
        tenant_slug=file.use_case.tenant.slug,
        tenant_id=file.use_case.tenant_id,
        object_repr=f"{file.use_case}: {file.filename}",
    )
    return apifile_chunks(file)


def batch_input_summary(file: ApiFile) -> BatchInput:
    """Line count, endpoint and model of a stored batch input (checked at upload): counts the
    requests and reads the first, without holding the file in memory."""
    count = 0
    first = b""
    stream = files_storage().open(file.object_name, "rb")
    try:
        for line in _lines(stream):
            if line.strip():
                count += 1
                first = first or line
    finally:
        stream.close()
    item = orjson.loads(first) if first else {}
    return BatchInput(
        lines=count, url=item.get("url", ""), model=item.get("body", {}).get("model", "")
    )


def batch_result_file(
    *, registration_id: int, purpose: str, object_name: str, content: bytes
) -> str:
    """Record a batch's output or error file (already in the bucket) as an ApiFile of the
    batch's use case; its id is derived from the batch, so a finish run again finds it."""
    registration = FileRegistration.objects.select_related("use_case").get(pk=registration_id)
    digest = hashlib.sha256(f"{registration_id}:{purpose}".encode()).hexdigest()
    public_id = f"file-{digest[:24]}"
    ApiFile.objects.update_or_create(
        public_id=public_id,
        defaults={
            "use_case": registration.use_case,
            "api_key": registration.api_key,
            "purpose": purpose,
            "filename": f"batch_{registration_id}_{purpose.removeprefix('batch_')}.jsonl",
            "bytes": len(content),
            "sha256": hashlib.sha256(content).hexdigest(),
            "object_name": object_name,
        },
    )
    return public_id


def apifile_object(file: ApiFile) -> dict[str, Any]:
    """The OpenAI file object."""
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at.timestamp()),
        "expires_at": int(file.expires_at.timestamp()) if file.expires_at else None,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }

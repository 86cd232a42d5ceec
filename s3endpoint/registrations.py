"""Which registered file an object key names, and whether it may be uploaded now.

Object keys in a use case's virtual bucket are ``<registration id>/<filename>``. An upload is
accepted only for a registration of the signing credential's use case, still ``registered``,
with that filename; its size may not pass the SLA class's ``max_file_bytes`` nor the declared
size plus a small slack (``SIZE_SLACK``): the feasibility promise was made on the declared size.
"""

from __future__ import annotations

from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.db.models import Q

from governance.choices import FileState
from governance.models import FileRegistration, UseCase
from s3endpoint.errors import S3Error
from s3endpoint.principals import Principal
from scheduler.files.upload_events import upload_object_name

# A declared size is often rounded ("about 40 MB"): allow 1 % over it, and at least 64 KiB.
SIZE_SLACK_RATIO = 0.01
SIZE_SLACK_MIN = 64 * 1024


def size_limit(declared_bytes: int, max_file_bytes: int | None) -> int:
    slack = max(SIZE_SLACK_MIN, int(declared_bytes * SIZE_SLACK_RATIO))
    limit = declared_bytes + slack
    return min(limit, max_file_bytes) if max_file_bytes is not None else limit


@dataclass(frozen=True, slots=True)
class Target:
    registration_id: int
    filename: str
    object_name: str  # in the real files bucket
    max_bytes: int


def parse_key(key: str) -> tuple[int, str] | None:
    head, sep, filename = key.partition("/")
    if not sep or not head.isdigit() or not filename or len(head) > 18:
        return None
    return int(head), filename


def object_prefix(principal: Principal) -> str:
    """The folder of the use case's uploads in the files bucket (upload_object_name's)."""
    return upload_object_name(principal.tenant_slug, principal.use_case_slug, 0, "x")[: -len("0/x")]


def _target(principal: Principal, key: str, *, for_upload: bool) -> Target:
    parsed = parse_key(key)
    if parsed is None:
        raise S3Error(
            "AccessDenied", "Object keys are <registration id>/<filename> of a registered file."
        )
    registration_id, filename = parsed
    file = (
        FileRegistration.objects.select_related("sla_class")
        .filter(pk=registration_id, use_case_id=principal.use_case_id)
        .first()
    )
    if file is None or file.filename != filename:
        raise S3Error(
            "AccessDenied",
            f"No registration {registration_id} of this use case is named {filename!r}.",
        )
    if for_upload and file.state != FileState.REGISTERED:
        raise S3Error(
            "ConditionalRequestConflict",
            f"Registration {registration_id} is {file.state}; only a registered file is uploaded.",
        )
    limit = size_limit(
        file.declared_bytes, file.sla_class.max_file_bytes if file.sla_class else None
    )
    return Target(
        registration_id=registration_id,
        filename=filename,
        object_name=upload_object_name(
            principal.tenant_slug, principal.use_case_slug, registration_id, filename
        ),
        max_bytes=limit,
    )


async def target(principal: Principal, key: str, *, for_upload: bool = True) -> Target:
    found: Target = await database_sync_to_async(_target)(principal, key, for_upload=for_upload)
    return found


def _bucket_exists(name: str) -> bool:
    # Slugs hold hyphens too: every split of the name at a hyphen is a candidate.
    splits = [(name[:i], name[i + 1 :]) for i, char in enumerate(name) if char == "-"]
    if not splits:
        return False
    match = Q()
    for tenant, slug in splits:
        match |= Q(tenant__slug=tenant, slug=slug)
    return UseCase.objects.filter(match).exists()


async def check_bucket(principal: Principal, bucket: str) -> None:
    """The credential's own bucket only: another's is AccessDenied, none at all NoSuchBucket."""
    if bucket == principal.bucket:
        return
    if await database_sync_to_async(_bucket_exists)(bucket):
        raise S3Error("AccessDenied", "This bucket belongs to another use case.")
    raise S3Error("NoSuchBucket", "The specified bucket does not exist")

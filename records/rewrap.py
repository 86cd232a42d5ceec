"""Re-seal, under the current records key, everything a retired key sealed: the step of a key
rotation that lets the old key go (docs/records.md, "Encryption and key rotation").

What the records keys seal (records/sealing.py):

- S3 credential secrets (``S3Credential.secret_sealed``): the S3 endpoint checks every
  signature with them;
- webhook signing secrets (``UseCase.webhook_secret_sealed``);
- transcript objects in the records bucket (``RecordObject``).

A secret column is re-sealed with a conditional ``UPDATE … WHERE value = <as read>``, so a
secret rotated meanwhile (sealed under the current key already) is left alone. An object is
verified first (``records_verify``: a tampered object is reported, never re-attested), sealed
afresh under a new name beside the old one, then its row moves to that name in one
transaction with a ``records.object_resealed`` audit event (the row before and after: same
content checksum, new seal), and only then the old object is deleted. A crash in between
leaves an object no row names, which retention deletes with its hour.

Idempotent: what is under the current key already is counted, not touched, so a run that
stopped part-way is simply run again. Reading works throughout, since the retired key still
opens what it sealed until the run is done.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from dataclasses import dataclass, field

from django.db import models, transaction

from governance.audit import Actor, audit_record
from governance.models import AuditEvent, S3Credential, UseCase
from records.interactions import RESEALED_ACTION, records_verify, stored_detail
from records.models import RecordObject
from records.objects import (
    EncodedObject,
    ObjectUnreadable,
    delete_object,
    read_object,
    write_object,
)
from records.sealing import Keyring, SealError, keyring, reseal, sealed_key_id

logger = logging.getLogger(__name__)

ACTOR = Actor.system("records-rewrap")
OBJECTS_PER_QUERY = 200
# The sealed secret columns: (model, field, the report's name for them).
SEALED_COLUMNS: tuple[tuple[type[models.Model], str, str], ...] = (
    (S3Credential, "secret_sealed", "s3_credentials"),
    (UseCase, "webhook_secret_sealed", "webhook_secrets"),
)


@dataclass
class RewrapReport:
    current: str  # the key everything is sealed under afterwards
    # Re-sealed (or, checking only, still under a retired key), by kind.
    resealed: dict[str, int] = field(
        default_factory=lambda: {"s3_credentials": 0, "webhook_secrets": 0, "objects": 0}
    )
    unchanged: int = 0  # under the current key already
    failed: list[str] = field(default_factory=list)  # what could not be re-sealed, and why

    @property
    def left(self) -> int:
        return sum(self.resealed.values())

    def summary(self) -> str:
        counts = " ".join(f"{kind}={count}" for kind, count in self.resealed.items())
        return f"{counts} unchanged={self.unchanged} failed={len(self.failed)}"


def records_rewrap(*, check_only: bool = False, ring: Keyring | None = None) -> RewrapReport:
    """Re-seal under the current key whatever another key sealed; with ``check_only``, count
    it without changing anything (``resealed`` then says what is left to do)."""
    ring = ring or keyring()
    report = RewrapReport(current=ring.current)
    for model, column, kind in SEALED_COLUMNS:
        _rewrap_column(model, column, kind, ring, report, check_only)
    _rewrap_objects(ring, report, check_only)
    logger.info(
        "records_rewrap current=%s check_only=%s %s", ring.current, check_only, report.summary()
    )
    return report


def _rewrap_column(
    model: type[models.Model],
    column: str,
    kind: str,
    ring: Keyring,
    report: RewrapReport,
    check_only: bool,
) -> None:
    # Small tables (credentials, use cases): read at once, not with a cursor held open
    # across the updates.
    rows = list(
        model._default_manager.exclude(**{column: ""}).order_by("pk").values_list("pk", column)
    )
    for pk, value in rows:
        try:
            blob = base64.b64decode(value, validate=True)
            stale = sealed_key_id(blob) != ring.current
            fresh = reseal(blob, ring) if stale and not check_only else None
        except (SealError, ValueError) as exc:
            report.failed.append(f"{model._meta.label} {pk}: {exc}")
            continue
        if not stale:
            report.unchanged += 1
            continue
        if fresh is None:  # checking only: left to do
            report.resealed[kind] += 1
            continue
        sealed = base64.b64encode(fresh).decode()
        moved = model._default_manager.filter(**{"pk": pk, column: value}).update(
            **{column: sealed}
        )
        report.resealed[kind] += moved
        report.unchanged += 1 - moved  # changed meanwhile: sealed under the current key


def _rewrap_objects(ring: Keyring, report: RewrapReport, check_only: bool) -> None:
    report.unchanged += RecordObject.objects.filter(key_id=ring.current).count()
    last = 0
    while True:
        batch = list(
            RecordObject.objects.exclude(key_id=ring.current)
            .filter(pk__gt=last)
            .order_by("pk")[:OBJECTS_PER_QUERY]
        )
        if not batch:
            return
        last = batch[-1].pk
        for obj in batch:
            if check_only:
                report.resealed["objects"] += 1
                continue
            problem = _rewrap_object(obj, ring)
            if problem is None:
                report.resealed["objects"] += 1
            elif problem:
                report.failed.append(f"record object {obj.key}: {problem}")


def resealed_key(key: str, sealed_sha256: str) -> str:
    """Beside the old object, so retention's hour prefix still holds it: the batch's stem and
    the start of the new seal's checksum (``<first>_<last>.r<sha>.jsonl.gz.sealed``)."""
    prefix, _, name = key.rpartition("/")
    stem = name.split(".", 1)[0]
    return f"{prefix}/{stem}.r{sealed_sha256[:16]}.jsonl.gz.sealed"


def _rewrap_object(obj: RecordObject, ring: Keyring) -> str | None:
    """None once re-sealed; "" when the row moved meanwhile (retention deleted it, or
    another run re-sealed it); otherwise why the object was left as it is."""
    try:
        sealed = read_object(obj.key)
    except ObjectUnreadable as exc:
        return str(exc)
    verdict = records_verify(obj, stored=sealed)
    if not verdict.ok:
        return f"fails verification, left as it is: {verdict.problem}"
    fresh = reseal(sealed, ring)
    if fresh is None:
        return "sealed with the current key already, but its row says otherwise"
    sealed_sha256 = hashlib.sha256(fresh).hexdigest()
    new_key = resealed_key(obj.key, sealed_sha256)
    write_object(
        new_key,
        EncodedObject(fresh, obj.sha256, sealed_sha256, line_sha256=[], key_id=ring.current),
    )
    with transaction.atomic():
        row = (
            RecordObject.objects.select_for_update()
            .filter(pk=obj.pk, key=obj.key, sealed_sha256=obj.sealed_sha256)
            .first()
        )
        if row is not None:
            before = {**stored_detail(row), "audit_sequence": row.audit_sequence}
            row.key, row.sealed_sha256 = new_key, sealed_sha256
            row.size, row.key_id = len(fresh), ring.current
            stored_event = AuditEvent.objects.filter(sequence=before["audit_sequence"]).first()
            event = audit_record(
                actor=ACTOR,
                action=RESEALED_ACTION,
                obj=row,
                object_repr=f"{row.records} transcripts re-sealed in {new_key}"[:200],
                tenant_slug=stored_event.tenant_slug if stored_event else "",
                tenant_id=row.tenant_id,
                before=before,
                after=stored_detail(row),
            )
            row.audit_sequence = event.sequence
            row.save(update_fields=["key", "sealed_sha256", "size", "key_id", "audit_sequence"])
    if row is None:
        delete_object(new_key)
        return ""
    delete_object(obj.key)  # after the commit: until then, the row named it
    return None

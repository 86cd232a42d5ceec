"""The signed audit-trail export: the events as JSON Lines, then a signed summary.

Format (one JSON object per line, keys sorted)::

    {<an event's hashed fields>..., "hash": "<its hash>"}        one line per event
    {"summary": {...}, "algorithm": "Ed25519", "public_key": "<b64>", "signature": "<b64>"}

An event line holds exactly the fields its hash covers (governance.audit), so anyone can
recompute each hash and each link (``prev_hash``) without the database. The summary names
the range, the number of events, the SHA-256 of every byte before the summary line, and the
result of walking the whole chain (``audit_verify()``) when the export was made; the signature
is Ed25519 over the summary's canonical JSON (sorted keys, no spaces).

The signing key is ``SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY`` (a base64 32-byte Ed25519 seed);
production requires it, the embedded demo derives one from the secret key. Check a download
offline with ``manage.py audit_export_verify FILE`` or ``export_verify`` below (it needs only
orjson and cryptography).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Generator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings
from django.db.models import QuerySet

from governance.audit import Actor, _canonical, audit_record, audit_verify
from governance.models import AuditEvent

EXPORT_KIND = "switchyard-audit-export"
EXPORT_VERSION = 1
EXPORT_FETCH_ROWS = 2000
EXPORT_CHUNK_EVENTS = 500


# --- the key --------------------------------------------------------------------------------
def parse_signing_key(encoded: str) -> Ed25519PrivateKey:
    """A base64 32-byte seed as a private key; ValueError says what is wrong."""
    try:
        seed = base64.b64decode(encoded.strip(), validate=True)
    except ValueError as exc:
        raise ValueError("SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY is not valid base64") from exc
    if len(seed) != 32:
        raise ValueError("SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY must be 32 bytes (base64)")
    return Ed25519PrivateKey.from_private_bytes(seed)


@cache
def _signing_key_for(encoded: str) -> Ed25519PrivateKey:
    return parse_signing_key(encoded)


def signing_key() -> Ed25519PrivateKey:
    return _signing_key_for(settings.AUDIT_EXPORT_SIGNING_KEY)


def public_key_text(key: Ed25519PublicKey) -> str:
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def signing_public_key() -> str:
    """The public half of the configured key, base64: what a verifier compares against."""
    return public_key_text(signing_key().public_key())


def _summary_bytes(summary: dict[str, Any]) -> bytes:
    return orjson.dumps(summary, option=orjson.OPT_SORT_KEYS)


# --- the export -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AuditExportRange:
    """Which events: a sequence range and/or a time range (all optional, inclusive starts,
    exclusive time end, inclusive sequence end)."""

    from_sequence: int | None = None
    to_sequence: int | None = None
    since: datetime | None = None
    until: datetime | None = None

    def events(self) -> QuerySet[AuditEvent]:
        found = AuditEvent.objects.order_by("sequence")
        if self.from_sequence is not None:
            found = found.filter(sequence__gte=self.from_sequence)
        if self.to_sequence is not None:
            found = found.filter(sequence__lte=self.to_sequence)
        if self.since is not None:
            found = found.filter(occurred_at__gte=self.since)
        if self.until is not None:
            found = found.filter(occurred_at__lt=self.until)
        return found

    def describe(self) -> dict[str, Any]:
        values = {
            "from_sequence": self.from_sequence,
            "to_sequence": self.to_sequence,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
        }
        return {name: value for name, value in values.items() if value is not None}


def event_line(event: AuditEvent) -> bytes:
    """An event as exported: its hashed fields and its hash (keys sorted)."""
    fields = orjson.loads(_canonical(event))
    fields["hash"] = event.hash
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS) + b"\n"


@dataclass
class _Progress:
    events: int = 0
    events_digest: Any = field(default_factory=hashlib.sha256)
    file_digest: Any = field(default_factory=hashlib.sha256)
    complete: bool = False


def audit_export(*, actor: Actor, wanted: AuditExportRange) -> Generator[bytes]:
    """The export's bytes, a few hundred events per chunk; the signed summary last. When it
    ends (finished, or closed early) one ``audit.exported`` event records who, the range,
    how many events and the SHA-256 of what was sent."""
    progress = _Progress()
    first: int | None = None
    last: int | None = None
    try:
        pending: list[bytes] = []
        for event in wanted.events().iterator(chunk_size=EXPORT_FETCH_ROWS):
            first = event.sequence if first is None else first
            last = event.sequence
            pending.append(event_line(event))
            if len(pending) >= EXPORT_CHUNK_EVENTS:
                yield _sent(progress, pending, events=True)
                pending = []
        if pending:
            yield _sent(progress, pending, events=True)
        report = audit_verify()
        summary = {
            "kind": EXPORT_KIND,
            "version": EXPORT_VERSION,
            "generated_at": datetime.now(UTC).isoformat(),
            "range": wanted.describe(),
            "events": progress.events,
            "first_sequence": first,
            "last_sequence": last,
            "sha256": progress.events_digest.hexdigest(),
            "chain": asdict(report),
        }
        key = signing_key()
        final = {
            "summary": summary,
            "algorithm": "Ed25519",
            "public_key": public_key_text(key.public_key()),
            "signature": base64.b64encode(key.sign(_summary_bytes(summary))).decode(),
        }
        yield _sent(progress, [orjson.dumps(final, option=orjson.OPT_SORT_KEYS) + b"\n"])
        progress.complete = True
    finally:
        audit_record(
            actor=actor,
            action="audit.exported",
            object_repr=f"{progress.events} audit events",
            after={
                "range": wanted.describe(),
                "events": progress.events,
                "sha256": progress.file_digest.hexdigest(),
                "complete": progress.complete,
            },
        )


def _sent(progress: _Progress, lines: list[bytes], *, events: bool = False) -> bytes:
    chunk = b"".join(lines)
    progress.file_digest.update(chunk)
    if events:
        progress.events_digest.update(chunk)
        progress.events += len(lines)
    return chunk


def export_filename(moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return f"switchyard-audit-{moment:%Y%m%dT%H%M%SZ}.jsonl"


# --- offline verification -------------------------------------------------------------------
@dataclass(frozen=True)
class ExportCheck:
    """What checking a downloaded export found. ``ok``: the file is exactly what the key
    signed and its events hash and link up; ``chain_ok``: the server's walk of the whole
    chain found it intact when the export was made."""

    ok: bool
    problem: str = ""
    events: int = 0
    chain_ok: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    public_key: str = ""


def export_verify(data: bytes, *, public_key: str | None = None) -> ExportCheck:
    """Check an export without the database: the signature (by ``public_key``, base64, when
    given: without it, only that the file is self-consistent), the SHA-256, every event's hash
    and every link between consecutive events."""
    if not data.endswith(b"\n"):
        return ExportCheck(False, "the file does not end with a complete line")
    body, _, final_line = data[:-1].rpartition(b"\n")
    body = body + b"\n" if body else b""
    try:
        final = orjson.loads(final_line)
        summary: dict[str, Any] = final["summary"]
        signature = base64.b64decode(final["signature"], validate=True)
        embedded_key = str(final["public_key"])
        signer = Ed25519PublicKey.from_public_bytes(base64.b64decode(embedded_key, validate=True))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return ExportCheck(False, "the last line is not a signed export summary")
    if public_key is not None and public_key.strip() != embedded_key:
        return ExportCheck(False, "the export was signed by another key", public_key=embedded_key)
    try:
        signer.verify(signature, _summary_bytes(summary))
    except InvalidSignature:
        return ExportCheck(False, "the summary's signature does not verify", summary=summary)
    if summary.get("kind") != EXPORT_KIND:
        return ExportCheck(False, "this is not a Switchyard audit export", summary=summary)
    if hashlib.sha256(body).hexdigest() != summary.get("sha256"):
        return ExportCheck(False, "the events differ from the signed SHA-256", summary=summary)
    events = 0
    previous: dict[str, Any] | None = None
    for number, raw in enumerate(body.splitlines(), start=1):
        try:
            event = orjson.loads(raw)
            claimed = event.pop("hash")
        except (orjson.JSONDecodeError, KeyError, AttributeError):
            return ExportCheck(False, f"line {number} is not an audit event", summary=summary)
        if hashlib.sha256(orjson.dumps(event, option=orjson.OPT_SORT_KEYS)).hexdigest() != claimed:
            return ExportCheck(
                False, f"event #{event.get('sequence')} does not match its hash", summary=summary
            )
        if previous is not None and (
            event.get("sequence") != previous["sequence"] + 1
            or event.get("prev_hash") != previous["hash"]
        ):
            return ExportCheck(
                False,
                f"event #{event.get('sequence')} does not link to the event before it",
                summary=summary,
            )
        previous = {"sequence": event.get("sequence"), "hash": claimed}
        events += 1
    if events != summary.get("events"):
        return ExportCheck(False, "the number of events differs from the summary", summary=summary)
    chain = summary.get("chain") or {}
    return ExportCheck(
        True,
        events=events,
        chain_ok=bool(chain.get("ok")),
        summary=summary,
        public_key=embedded_key,
    )

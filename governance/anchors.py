"""Checkpoints that anchor the audit chain outside the database.

The chain's hashes are unkeyed: whoever can drop the append-only trigger can rewrite every
event and recompute every hash, head included, and the chain alone still verifies. A
checkpoint is the head (sequence and hash) signed with HMAC-SHA256 under a key the database
does not hold (``SWITCHYARD_AUDIT_ANCHOR_KEY``), written as a file in a directory outside it
(``SWITCHYARD_AUDIT_ANCHOR_DIR``; object storage can take its place). A rewritten chain then
disagrees with an earlier checkpoint, and one cut back below a checkpoint comes up short.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson
from django.conf import settings
from django.utils import timezone

from governance.models import AuditChainHead

_PREFIX = "audit-checkpoint-"


@dataclass(frozen=True)
class Checkpoint:
    sequence: int
    hash: str
    written_at: str
    signature: str
    name: str

    def signed_correctly(self) -> bool:
        return hmac.compare_digest(self.signature, _sign(self.sequence, self.hash, self.written_at))


def _sign(sequence: int, head_hash: str, written_at: str) -> str:
    message = orjson.dumps(
        {"sequence": sequence, "hash": head_hash, "written_at": written_at},
        option=orjson.OPT_SORT_KEYS,
    )
    key = str(settings.AUDIT_ANCHOR_KEY).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _directory() -> Path:
    return Path(settings.AUDIT_ANCHOR_DIR)


def checkpoint_write() -> Checkpoint | None:
    """Sign the chain's current head into a new file; nothing when the chain is empty or the
    head is already anchored. Written to a temporary name and renamed, so a reader never
    sees half a checkpoint."""
    head = AuditChainHead.objects.filter(id=1).first()
    if head is None or head.last_sequence == 0:
        return None
    directory = _directory()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{_PREFIX}{head.last_sequence:015d}.json"
    if target.exists():
        return None
    written_at = timezone.now().isoformat()
    checkpoint = Checkpoint(
        sequence=head.last_sequence,
        hash=head.last_hash,
        written_at=written_at,
        signature=_sign(head.last_sequence, head.last_hash, written_at),
        name=target.name,
    )
    body = orjson.dumps(
        {
            "sequence": checkpoint.sequence,
            "hash": checkpoint.hash,
            "written_at": checkpoint.written_at,
            "signature": checkpoint.signature,
        },
        option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2,
    )
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".writing-")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return checkpoint


class UnreadableCheckpoint(ValueError):
    """A file in the anchor directory that is not a well-formed checkpoint."""


def checkpoints_read() -> list[Checkpoint]:
    """Every checkpoint in the directory, oldest first (an absent directory holds none)."""
    directory = _directory()
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob(f"{_PREFIX}*.json")):
        try:
            data = orjson.loads(path.read_bytes())
            found.append(
                Checkpoint(
                    sequence=int(data["sequence"]),
                    hash=str(data["hash"]),
                    written_at=str(data["written_at"]),
                    signature=str(data["signature"]),
                    name=path.name,
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise UnreadableCheckpoint(f"{path.name} is not a checkpoint: {exc}") from exc
    return sorted(found, key=lambda c: c.sequence)

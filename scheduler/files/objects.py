"""The files bucket as the pipelines see it: read an object, write one under a fixed name.

Over django's ``storages["files"]`` (SeaweedFS or any S3 store, or the filesystem), so the
pipelines never name a backend. Names are deterministic (a part's output depends on its index
only) and the storage overwrites (``file_overwrite`` / ``allow_overwrite``): a rewrite after a
crash is a retry, never a second copy under a mangled name.
"""

from __future__ import annotations

import posixpath

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages


class StoredNameChanged(RuntimeError):
    """The storage saved under another name than asked: it is not set to overwrite."""


class FilesStore:
    """``pipelines.base.ObjectStore`` over ``storages["files"]``."""

    def __init__(self, storage: Storage | None = None) -> None:
        self.storage = storage if storage is not None else storages["files"]

    def read(self, name: str) -> bytes:
        with self.storage.open(name, "rb") as handle:
            return bytes(handle.read())

    def write(
        self, name: str, content: bytes, content_type: str = "application/octet-stream"
    ) -> None:
        upload = ContentFile(content, name=posixpath.basename(name))
        upload.content_type = content_type  # type: ignore[attr-defined]  # S3Storage reads it
        saved = self.storage.save(name, upload)
        if saved != name:
            raise StoredNameChanged(f"stored as {saved!r}, not {name!r}: enable overwrite")

    def exists(self, name: str) -> bool:
        return bool(self.storage.exists(name))


def output_prefix(source_object: str) -> str:
    """Outputs sit beside the original: ``<dir of the original>/out/``."""
    folder = posixpath.dirname(source_object)
    return f"{folder}/out/" if folder else "out/"

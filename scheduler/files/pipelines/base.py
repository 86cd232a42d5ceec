"""The contract between the job runner and the pipelines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class PartFailed(Exception):
    """This part cannot succeed (bad input the retry will not fix): the file fails with
    ``str(exc)`` as its reason, shown to the team (no content, no secrets)."""


class RequestRefused(PartFailed):
    """The gateway refused one request with a 4xx that a retry will not change (a guardrail,
    a bad body): a part of many requests (a batch) records it on that request's line; others
    fail with it. Carries what OpenAI's batch output shows of a refused request."""

    def __init__(
        self, message: str, *, status_code: int, body: object, request_id: str = ""
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body
        self.request_id = request_id


class Retryable(Exception):
    """This part failed for a reason that may pass (the gateway refused with 429/503, a
    replica died): run it again later, within the job's attempts."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class JobContext:
    """What a pipeline knows about the job it runs a part of."""

    registration_id: int
    kind: str
    model: str  # the registration's model (public id)
    models: Sequence[str]  # every model the use case may call (an embedding model, say)
    filename: str
    source_object: str  # the original in the files bucket
    output_prefix: str  # where its outputs go in the files bucket ("…/<id>/out/")
    request_endpoint: str = ""  # batch: the lines' endpoint
    settings: Mapping[str, Any] = field(default_factory=dict)  # e.g. the use case's prompt
    # What the registration said of the file's size, which its promise and estimate were made
    # on: a pipeline refuses a file that decodes to far more (a decode bomb) rather than
    # spend the fleet on it. None: nothing was said.
    audio_seconds: float | None = None  # declared, or what the token estimate was sized on
    pages: int | None = None  # declared pages of a document


@dataclass(frozen=True)
class PartResult:
    output_object: str  # the part's result in the files bucket
    tokens: int = 0
    counts: Mapping[str, int] = field(default_factory=dict)  # e.g. {"completed": 9, "failed": 1}


class GatewayCaller(Protocol):
    """Calls the gateway as the job (its SLA class's job key): admission, priority, limits,
    guardrails and records are the gateway's. Raises ``Retryable`` on 429/503/connection
    errors, ``PartFailed`` on a 4xx the input caused; returns the decoded JSON answer."""

    def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def post_multipart(
        self, path: str, fields: Mapping[str, str], file_name: str, content: bytes, mime: str
    ) -> dict[str, Any]: ...


class ObjectStore(Protocol):
    """The files bucket (STORAGES["files"]); names are deterministic, so a rewrite is a retry."""

    def read(self, name: str) -> bytes: ...

    def write(
        self, name: str, content: bytes, content_type: str = "application/octet-stream"
    ) -> None: ...


class Pipeline(Protocol):
    kind: str

    def plan(self, job: JobContext, store: ObjectStore) -> list[dict[str, Any]]:
        """The parts' specs (JSON), in order; read once per job and kept in FilePart rows."""
        ...

    def run_part(
        self,
        job: JobContext,
        spec: Mapping[str, Any],
        index: int,
        gateway: GatewayCaller,
        store: ObjectStore,
    ) -> PartResult:
        """Run one part; idempotent: its output object's name depends on ``index`` only."""
        ...

    def finish(
        self, job: JobContext, parts: Sequence[PartResult], store: ObjectStore
    ) -> tuple[dict[str, str], dict[str, int]]:
        """Assemble the outputs: (name → object name, e.g. {"transcript.json": "…"}, counts)."""
        ...


PIPELINES: dict[str, Pipeline] = {}


def register(pipeline: Pipeline) -> Pipeline:
    PIPELINES[pipeline.kind] = pipeline
    return pipeline

"""Reading interaction records: who sees which, searching them, one transcript, exports.

The business rules of the auditors' side of records live here; the portal pages
(portal/records_views.py) and the API (governance/api/records.py) only parse, call and render.

Who sees what (docs/records.md), enforced by ``records_visible_to`` and nowhere else:

- auditors, officers and admins read every record and its content;
- developers read the records of their own tenants' use cases whose
  ``records_visible_to_developers`` is set — metadata, and content where it was kept;
- everyone else reads nothing, and a record outside a person's scope is "not found".

Nobody changes or deletes a record here: retention does (scheduler/record_retention.py).
Reading content goes through ``ObjectCache``, which checks the object's stored checksum, and
each line's own checksum; what does not match is shown as "cannot be verified", never as text.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from django import forms
from django.conf import settings
from django.db.models import QuerySet

from governance.audit import Actor, audit_record
from governance.models import ApiKey, Tenant, UseCase
from governance.roles import AnyUser, Role, can_read_everything, has_role
from scheduler.models import AdmissionDecision, GuardrailFinding, InteractionRecord
from scheduler.record_objects import ObjectCache, ObjectUnreadable, TranscriptLine, field_bytes

RECORDS_PER_PAGE = 50
EXPORT_FORMATS = ("jsonl", "csv")
# Rows fetched per database round trip while exporting, and rows per chunk handed to the
# web server: a few hundred keeps memory flat and the number of thread hops small.
EXPORT_FETCH_ROWS = 500
EXPORT_CHUNK_ROWS = 200
# Decoded objects kept while exporting (newest first interleaves a few use cases' objects).
EXPORT_CACHED_OBJECTS = 32


# --- who sees what ------------------------------------------------------------------------
def records_visible_to(user: AnyUser) -> QuerySet[InteractionRecord]:
    """The one place that decides which records a person may read (see the module doc)."""
    if can_read_everything(user):
        return InteractionRecord.objects.all()
    if has_role(user, Role.DEVELOPER):
        use_cases = UseCase.objects.filter(
            tenant__members=user,  # type: ignore[misc]
            records_visible_to_developers=True,
        ).values_list("pk", flat=True)
        return InteractionRecord.objects.filter(use_case_id__in=list(use_cases))
    return InteractionRecord.objects.none()


def may_search_records(user: AnyUser) -> bool:
    """Whether the records pages are for this person at all (developers may have none)."""
    return can_read_everything(user) or has_role(user, Role.DEVELOPER)


def record_use_cases_visible(user: AnyUser) -> QuerySet[UseCase]:
    """The use cases a person may filter records by: those whose records they may read."""
    found = UseCase.objects.select_related("tenant").order_by("tenant__slug", "slug")
    if can_read_everything(user):
        return found
    if has_role(user, Role.DEVELOPER):
        return found.filter(
            tenant__members=user,  # type: ignore[misc]
            records_visible_to_developers=True,
        )
    return found.none()


def record_tenants_visible(user: AnyUser) -> QuerySet[Tenant]:
    tenants = Tenant.objects.order_by("slug")
    if can_read_everything(user):
        return tenants
    ids = record_use_cases_visible(user).values_list("tenant_id", flat=True)
    return tenants.filter(pk__in=list(ids))


# --- search -------------------------------------------------------------------------------
_STATUS = re.compile(r"^(?:[1-5][0-9][0-9]|[1-5]xx)$")


@dataclass(frozen=True)
class RecordFilter:
    """A search over records, as validated by ``RecordSearchForm``."""

    tenant: Tenant | None = None
    use_case: UseCase | None = None
    key: str = ""  # a key id, or the start of a key's prefix
    model: str = ""
    since: datetime | None = None
    until: datetime | None = None
    status: str = ""  # "404" or a class, "4xx"
    guardrail: str = ""
    guardrail_action: str = ""
    request_id: str = ""
    record_id: str = ""
    content: str = ""

    def describe(self) -> dict[str, Any]:
        """The filter as the audit trail records it: only what was set, as plain values."""
        values: dict[str, Any] = {
            "tenant": self.tenant.slug if self.tenant else "",
            "use_case": self.use_case.pk if self.use_case else None,
            "key": self.key,
            "model": self.model,
            "since": self.since.isoformat() if self.since else "",
            "until": self.until.isoformat() if self.until else "",
            "status": self.status,
            "guardrail": self.guardrail,
            "guardrail_action": self.guardrail_action,
            "request_id": self.request_id,
            "record_id": self.record_id,
            "content": self.content,
        }
        return {name: value for name, value in values.items() if value not in ("", None)}


class UtcDateTimeField(forms.DateTimeField):
    """ISO 8601 or a browser's ``datetime-local``: naive is UTC, an offset is taken to UTC."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")

    def to_python(self, value: Any) -> datetime | None:
        parsed: datetime | None = super().to_python(value)
        if parsed is None:
            return None
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("Enter a time that exists in UTC.") from None

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(UTC).replace(tzinfo=None)
        return value


class RecordSearchForm(forms.Form):
    """The records search, shared by the portal page and the API's query parameters: every
    field optional; a tenant or use case outside the person's scope is "not a valid choice",
    the same answer as one that does not exist."""

    record_id = forms.CharField(required=False, max_length=40, label="Record id")
    request_id = forms.CharField(required=False, max_length=128, label="Request id")
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.none(), required=False, to_field_name="slug", empty_label="Any"
    )
    use_case = forms.ModelChoiceField(
        queryset=UseCase.objects.none(), required=False, empty_label="Any use case"
    )
    key = forms.CharField(
        required=False, max_length=32, help_text="A key's id, or the start of its prefix."
    )
    model = forms.CharField(required=False, max_length=200)
    status = forms.CharField(
        required=False, max_length=3, help_text="Exact (429) or a class (4xx, 5xx)."
    )
    guardrail = forms.CharField(
        required=False, max_length=64, help_text="Records with a finding of this guardrail."
    )
    guardrail_action = forms.ChoiceField(
        required=False,
        label="Finding action",
        choices=[("", "Any action"), *GuardrailFinding.Action.choices],
    )
    content = forms.ChoiceField(
        required=False,
        label="Content",
        choices=[("", "Any"), *InteractionRecord.Content.choices],
    )
    since = UtcDateTimeField(required=False, label="From (UTC)", help_text="Inclusive.")
    until = UtcDateTimeField(required=False, label="To (UTC)", help_text="Exclusive.")

    def __init__(self, *args: Any, user: AnyUser, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        tenant: Any = self.fields["tenant"]
        tenant.queryset = record_tenants_visible(user)
        use_case: Any = self.fields["use_case"]
        use_case.queryset = record_use_cases_visible(user)

    def _text(self, name: str) -> str:
        value = str(self.cleaned_data.get(name) or "").strip()
        if "\x00" in value:
            raise forms.ValidationError("Enter text without NUL characters.")
        return value

    def clean_record_id(self) -> str:
        return self._text("record_id")

    def clean_request_id(self) -> str:
        return self._text("request_id")

    def clean_model(self) -> str:
        return self._text("model")

    def clean_guardrail(self) -> str:
        return self._text("guardrail")

    def clean_key(self) -> str:
        value = self._text("key")
        if value and not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            raise forms.ValidationError("Enter a key id or the start of a key prefix.")
        return value

    def clean_status(self) -> str:
        value = self._text("status").lower()
        if value and not _STATUS.match(value):
            raise forms.ValidationError("Enter a status code (429) or a class (4xx).")
        return value

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since is not None and until is not None and until <= since:
            self.add_error("until", "Choose a time after “From”.")
        return cleaned

    def record_filter(self) -> RecordFilter:
        data = self.cleaned_data
        return RecordFilter(
            tenant=data.get("tenant"),
            use_case=data.get("use_case"),
            key=data.get("key", ""),
            model=data.get("model", ""),
            since=data.get("since"),
            until=data.get("until"),
            status=data.get("status", ""),
            guardrail=data.get("guardrail", ""),
            guardrail_action=data.get("guardrail_action", ""),
            request_id=data.get("request_id", ""),
            record_id=data.get("record_id", ""),
            content=data.get("content", ""),
        )


def records_search(user: AnyUser, found: RecordFilter) -> QuerySet[InteractionRecord]:
    """The records a person may read that match, newest first (each filter is an indexed
    column, or a subquery on one: nothing is loaded per row)."""
    rows = records_visible_to(user)
    if found.record_id:
        rows = rows.filter(record_id=found.record_id)
    if found.request_id:
        rows = rows.filter(request_id=found.request_id)
    if found.tenant is not None:
        rows = rows.filter(tenant_id=found.tenant.pk)
    if found.use_case is not None:
        rows = rows.filter(use_case_id=found.use_case.pk)
    if found.key:
        if found.key.isdigit():
            rows = rows.filter(key_id=int(found.key))
        else:
            keys = ApiKey.objects.filter(prefix__startswith=found.key).values("pk")
            rows = rows.filter(key_id__in=keys)
    if found.model:
        rows = rows.filter(model=found.model)
    if found.status:
        if found.status.endswith("xx"):
            low = int(found.status[0]) * 100
            rows = rows.filter(status__gte=low, status__lt=low + 100)
        else:
            rows = rows.filter(status=int(found.status))
    if found.guardrail or found.guardrail_action:
        findings = GuardrailFinding.objects.exclude(record_id="")
        if found.guardrail:
            findings = findings.filter(guardrail=found.guardrail)
        if found.guardrail_action:
            findings = findings.filter(action=found.guardrail_action)
        rows = rows.filter(record_id__in=findings.values("record_id"))
    if found.content:
        rows = rows.filter(content=found.content)
    if found.since is not None:
        rows = rows.filter(occurred_at__gte=found.since)
    if found.until is not None:
        rows = rows.filter(occurred_at__lt=found.until)
    return rows.order_by("-occurred_at", "-id")


@dataclass(frozen=True)
class RecordRow:
    """One search result with what it names, looked up once per page, not per row."""

    record: InteractionRecord
    use_case: UseCase | None
    key: ApiKey | None


def record_rows(records: Sequence[InteractionRecord]) -> list[RecordRow]:
    use_case_ids = {r.use_case_id for r in records}
    key_ids = {r.key_id for r in records if r.key_id is not None}
    use_cases = UseCase.objects.select_related("tenant").in_bulk(use_case_ids)
    keys = ApiKey.objects.in_bulk(key_ids)
    return [
        RecordRow(r, use_cases.get(r.use_case_id), keys.get(r.key_id) if r.key_id else None)
        for r in records
    ]


# --- one transcript -----------------------------------------------------------------------
@dataclass(frozen=True)
class AssembledChoice:
    """One choice of a streamed answer, put back together from its SSE chunks."""

    index: int
    role: str = ""
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(frozen=True)
class AssembledStream:
    choices: list[AssembledChoice]
    chunks: int  # data events read
    done: bool  # the stream ended with ``data: [DONE]``
    error: str = ""  # an error event, as the gateway or vLLM sent it
    usage: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(choice.text for choice in self.choices)


def _sse_data(body: bytes) -> Iterator[str]:
    """The ``data:`` payloads of an SSE body (multi-line data joined, as the spec says)."""
    text = body.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    for event in text.split("\n\n"):
        lines = [
            line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")
        ]
        if lines:
            yield "\n".join(lines)


def assemble_stream(body: bytes) -> AssembledStream:
    """A streamed chat or text completion as one message per choice: the deltas' text joined,
    tool calls merged by index (their arguments concatenated), the last finish reason."""
    parts: dict[int, dict[str, Any]] = {}
    chunks = 0
    done = False
    error = ""
    usage: dict[str, Any] | None = None
    for data in _sse_data(body):
        if data.strip() == "[DONE]":
            done = True
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue  # a partial last event of a truncated capture
        if not isinstance(chunk, dict):
            continue
        chunks += 1
        if "error" in chunk:
            problem = chunk["error"]
            error = str(problem.get("message", problem) if isinstance(problem, dict) else problem)
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = int(choice.get("index") or 0)
            part = parts.setdefault(
                index, {"role": "", "text": [], "reasoning": [], "tools": {}, "finish": None}
            )
            delta = choice.get("delta")
            if isinstance(delta, dict):
                part["role"] = delta.get("role") or part["role"]
                if isinstance(delta.get("content"), str):
                    part["text"].append(delta["content"])
                for name in ("reasoning_content", "reasoning"):
                    if isinstance(delta.get(name), str):
                        part["reasoning"].append(delta[name])
                for call in delta.get("tool_calls") or []:
                    _merge_tool_call(part["tools"], call)
            elif isinstance(choice.get("text"), str):  # a text completion
                part["text"].append(choice["text"])
            if choice.get("finish_reason"):
                part["finish"] = choice["finish_reason"]
    return AssembledStream(
        choices=[
            AssembledChoice(
                index=index,
                role=part["role"],
                text="".join(part["text"]),
                reasoning="".join(part["reasoning"]),
                tool_calls=[part["tools"][i] for i in sorted(part["tools"])],
                finish_reason=part["finish"],
            )
            for index, part in sorted(parts.items())
        ],
        chunks=chunks,
        done=done,
        error=error,
        usage=usage,
    )


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: Any) -> None:
    if not isinstance(delta, dict):
        return
    index = int(delta.get("index") or 0)
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function")
    if isinstance(function, dict):
        if function.get("name"):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]


@dataclass(frozen=True)
class TranscriptContent:
    """A record's request and response as stored (text, or base64 when not UTF-8)."""

    request: str
    request_encoding: str
    response: str
    response_encoding: str
    response_type: str
    truncated: bool

    @property
    def request_pretty(self) -> str:
        return _pretty(self.request, self.request_encoding)

    @property
    def response_pretty(self) -> str:
        return _pretty(self.response, self.response_encoding)


def _pretty(text: str, encoding: str) -> str:
    if encoding != "utf-8":
        return text
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return text


@dataclass(frozen=True)
class Transcript:
    """Everything about one record an auditor reads on one page."""

    record: InteractionRecord
    use_case: UseCase | None
    tenant: Tenant | None
    key: ApiKey | None
    decisions: list[AdmissionDecision]
    findings: list[GuardrailFinding]
    content: TranscriptContent | None
    # Why the content is not shown although it was stored ("cannot be verified: …").
    problem: str = ""
    assembled: AssembledStream | None = None


def record_find(user: AnyUser, record_id: str) -> InteractionRecord:
    """One record the person may read; ``InteractionRecord.DoesNotExist`` otherwise, whether
    it is missing or out of their scope (the views answer 404 to both)."""
    return records_visible_to(user).select_related("object").get(record_id=record_id)


def content_read(record: InteractionRecord, cache: ObjectCache) -> TranscriptLine:
    """The record's stored line, checked against the object's and the line's checksums.
    ``ObjectUnreadable`` when the content is missing, changed or will not open."""
    stored = record.object
    if stored is None or record.line is None or not record.content_sha256:
        raise ObjectUnreadable("the record's object is gone")
    line = cache.line(stored.key, stored.sealed_sha256, record.line, record.content_sha256)
    if line.get("record_id") != record.record_id:
        raise ObjectUnreadable("the object's line belongs to another record")
    return line


def _content_of(line: TranscriptLine) -> TranscriptContent:
    return TranscriptContent(
        request=line.get("request", ""),
        request_encoding=line.get("request_encoding", "utf-8"),
        response=line.get("response", ""),
        response_encoding=line.get("response_encoding", "utf-8"),
        response_type=line.get("response_type", ""),
        truncated=bool(line.get("truncated", False)),
    )


def transcript_read(
    *, actor: Actor, record: InteractionRecord, cache: ObjectCache | None = None
) -> Transcript:
    """The whole transcript of a record already found in the person's scope. Reading stored
    content is audited (``records.viewed``), whether or not it verifies."""
    use_case = UseCase.objects.select_related("tenant").filter(pk=record.use_case_id).first()
    tenant = (
        use_case.tenant
        if use_case is not None
        else Tenant.objects.filter(pk=record.tenant_id).first()
        if record.tenant_id is not None
        else None
    )
    key = ApiKey.objects.filter(pk=record.key_id).first() if record.key_id else None
    decisions = list(AdmissionDecision.objects.filter(record_id=record.record_id))
    findings = list(GuardrailFinding.objects.filter(record_id=record.record_id))
    content: TranscriptContent | None = None
    problem = ""
    assembled: AssembledStream | None = None
    if record.content == InteractionRecord.Content.STORED:
        try:
            line = content_read(record, cache or ObjectCache())
        except ObjectUnreadable as exc:
            problem = f"The content cannot be verified: {exc}."
        else:
            content = _content_of(line)
            if record.streamed or "text/event-stream" in content.response_type:
                assembled = assemble_stream(field_bytes(line, "response"))
        audit_record(
            actor=actor,
            action="records.viewed",
            obj=record,
            object_repr=record.record_id,
            tenant_slug=record.tenant,
            tenant_id=record.tenant_id,
            after={
                "record_id": record.record_id,
                "request_id": record.request_id,
                "use_case_id": record.use_case_id,
                "use_case": str(use_case) if use_case is not None else "",
                "tenant": record.tenant,
                "verified": content is not None,
            },
        )
    return Transcript(
        record=record,
        use_case=use_case,
        tenant=tenant,
        key=key,
        decisions=decisions,
        findings=findings,
        content=content,
        problem=problem,
        assembled=assembled,
    )


# --- exports ------------------------------------------------------------------------------
class ExportRefused(Exception):
    """An export that will not start (too many records, an unknown format)."""


EXPORT_COLUMNS = (
    "record_id",
    "request_id",
    "occurred_at",
    "tenant",
    "tenant_id",
    "use_case_id",
    "key_id",
    "model",
    "endpoint",
    "replica",
    "status",
    "streamed",
    "prompt_tokens",
    "completion_tokens",
    "queued_ms",
    "upstream_ms",
    "total_ms",
    "policy_version",
    "record_policy",
    "content",
    "content_sha256",
    "truncated",
)
CONTENT_COLUMNS = (
    "request",
    "request_encoding",
    "response",
    "response_encoding",
    "response_type",
    "content_error",
)


def export_limit() -> int:
    return int(settings.RECORDS_EXPORT_MAX_RECORDS)


def export_check(*, rows: QuerySet[InteractionRecord], fmt: str) -> int:
    """How many records an export would hold; ``ExportRefused`` beyond the limit."""
    if fmt not in EXPORT_FORMATS:
        raise ExportRefused(f"Choose a format: {', '.join(EXPORT_FORMATS)}.")
    count = rows.count()
    limit = export_limit()
    if count > limit:
        raise ExportRefused(
            f"This selection holds {count:,} records; an export holds at most {limit:,}. "
            "Narrow the search (a shorter time range, one use case)."
        )
    return count


def _export_row(record: InteractionRecord, cache: ObjectCache) -> dict[str, Any]:
    row: dict[str, Any] = {name: getattr(record, name) for name in EXPORT_COLUMNS}
    row["occurred_at"] = record.occurred_at.astimezone(UTC).isoformat()
    if record.content == InteractionRecord.Content.STORED:
        try:
            line = content_read(record, cache)
        except ObjectUnreadable as exc:
            row["content_error"] = f"cannot be verified: {exc}"
        else:
            for name in CONTENT_COLUMNS[:-1]:
                row[name] = line.get(name, "")
    return row


@dataclass
class ExportResult:
    """What an export wrote so far: its audit event says this, complete or cut short."""

    records: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    complete: bool = False

    @property
    def sha256(self) -> str:
        return str(self.digest.hexdigest())


def records_export(
    *,
    actor: Actor,
    rows: QuerySet[InteractionRecord],
    fmt: str,
    described: dict[str, Any],
) -> Generator[bytes]:
    """The export's bytes, a few hundred records per chunk, read with a database cursor and
    the object cache (memory stays flat). When it ends — finished, or closed early because
    the client went away — one ``records.exported`` event records who, the filter, the
    format, how many records and the SHA-256 of what was sent."""
    result = ExportResult()
    cache = ObjectCache(size=EXPORT_CACHED_OBJECTS)
    try:
        buffer = io.StringIO()
        writer = csv.DictWriter(
            buffer, fieldnames=[*EXPORT_COLUMNS, *CONTENT_COLUMNS], extrasaction="ignore"
        )
        if fmt == "csv":
            writer.writeheader()
        pending: list[bytes] = [buffer.getvalue().encode()] if fmt == "csv" else []
        in_chunk = 0
        records = rows.select_related("object").iterator(chunk_size=EXPORT_FETCH_ROWS)
        for record in records:
            row = _export_row(record, cache)
            if fmt == "csv":
                buffer.seek(0)
                buffer.truncate()
                writer.writerow(row)
                pending.append(buffer.getvalue().encode())
            else:
                pending.append(orjson.dumps(row) + b"\n")
            in_chunk += 1
            if in_chunk >= EXPORT_CHUNK_ROWS:
                chunk = b"".join(pending)
                pending, in_chunk = [], 0
                result.digest.update(chunk)
                result.records += EXPORT_CHUNK_ROWS
                yield chunk
        chunk = b"".join(pending)
        if chunk:
            result.digest.update(chunk)
            result.records += in_chunk
            yield chunk
        result.complete = True
    finally:
        audit_record(
            actor=actor,
            action="records.exported",
            object_repr=f"{result.records} records as {fmt}",
            after={
                "filter": described,
                "format": fmt,
                "records": result.records,
                "sha256": result.sha256,
                "complete": result.complete,
            },
        )


def export_filename(fmt: str, moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return f"switchyard-records-{moment:%Y%m%dT%H%M%SZ}.{fmt}"


def export_content_type(fmt: str) -> str:
    return "text/csv; charset=utf-8" if fmt == "csv" else "application/jsonl"

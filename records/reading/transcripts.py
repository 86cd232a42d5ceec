"""One transcript: its metadata, decisions, findings and verified content, and a streamed
answer put back together from its SSE chunks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from governance.audit import Actor, audit_record
from governance.models import ApiKey, Tenant, UseCase
from governance.roles import AnyUser
from records.models import AdmissionDecision, GuardrailFinding, InteractionRecord
from records.objects import ObjectCache, ObjectUnreadable, TranscriptLine, field_bytes
from records.reading.access import records_visible_to


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

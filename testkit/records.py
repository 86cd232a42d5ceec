"""Interaction records for the readers' tests, made as the persisters make them: rows through
the ORM, content as a real sealed object in the test's bucket (``records_store``)."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import orjson

from governance.models import UseCase
from records.models import InteractionRecord, RecordObject
from records.objects import (
    TranscriptLine,
    encode_object,
    object_key,
    text_field,
    write_object,
)

_sequence = itertools.count(1)
BASE_TIME = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def chat_request(text: str, *, model: str = "llama", stream: bool = False) -> bytes:
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": text}]}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def chat_response(text: str, *, model: str = "llama") -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
    )


def sse_response(*pieces: str, model: str = "llama") -> bytes:
    """A streamed chat answer as vLLM (and the simulator) frame it."""
    events = [
        {
            "id": "chatcmpl-2",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    ]
    for number, piece in enumerate(pieces):
        last = number == len(pieces) - 1
        events.append(
            {
                "id": "chatcmpl-2",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": piece},
                        "finish_reason": "stop" if last else None,
                    }
                ],
            }
        )
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def make_record(
    use_case: UseCase,
    *,
    minutes: int = 0,
    status: int = 200,
    model: str = "llama",
    key_id: int | None = None,
    request_id: str = "",
    policy: str = "metadata",
    streamed: bool = False,
    record_id: str = "",
) -> InteractionRecord:
    """A record's metadata row (content ``none``), ``minutes`` after BASE_TIME."""
    number = next(_sequence)
    return InteractionRecord.objects.create(
        record_id=record_id or uuid.uuid4().hex,
        request_id=request_id or f"req-{number}",
        occurred_at=BASE_TIME + timedelta(minutes=minutes),
        tenant=use_case.tenant.slug,
        tenant_id=use_case.tenant_id,
        use_case_id=use_case.pk,
        key_id=key_id,
        model=model,
        endpoint="/v1/chat/completions",
        replica="http://10.0.0.7:8000",
        status=status,
        streamed=streamed,
        prompt_tokens=12,
        completion_tokens=34,
        queued_ms=5,
        upstream_ms=120,
        total_ms=130,
        policy_version=7,
        record_policy=policy,
    )


def store_content(
    items: list[tuple[InteractionRecord, bytes, bytes]], *, response_type: str = ""
) -> RecordObject:
    """Store these records' content as one sealed object, as the records persister does."""
    first = items[0][0]
    hour = first.occurred_at.replace(minute=0, second=0, microsecond=0)
    lines: list[TranscriptLine] = []
    for record, request, response in items:
        request_text, request_encoding = text_field(request)
        response_text, response_encoding = text_field(response)
        lines.append(
            {
                "record_id": record.record_id,
                "request_id": record.request_id,
                "at_ms": int(record.occurred_at.timestamp() * 1000),
                "tenant": record.tenant,
                "use_case_id": record.use_case_id,
                "key_id": record.key_id,
                "model": record.model,
                "endpoint": record.endpoint,
                "status": record.status,
                "streamed": record.streamed,
                "request": request_text,
                "request_encoding": request_encoding,
                "response": response_text,
                "response_encoding": response_encoding,
                "response_type": response_type
                or ("text/event-stream" if record.streamed else "application/json"),
                "truncated": False,
            }
        )
    encoded = encode_object(lines)
    key = object_key(
        tenant_id=first.tenant_id,
        use_case_id=first.use_case_id,
        hour=hour,
        first=f"{next(_sequence)}-0",
        last=f"{next(_sequence)}-0",
    )
    write_object(key, encoded)
    stored = RecordObject.objects.create(
        key=key,
        use_case_id=first.use_case_id,
        tenant_id=first.tenant_id,
        hour=hour,
        records=len(lines),
        size=len(encoded.sealed),
        sha256=encoded.sha256,
        sealed_sha256=encoded.sealed_sha256,
        key_id=encoded.key_id,
    )
    for index, (record, _request, _response) in enumerate(items):
        record.content = InteractionRecord.Content.STORED
        record.record_policy = "full"
        record.object = stored
        record.line = index
        record.content_sha256 = encoded.line_sha256[index]
        record.save()
    return stored

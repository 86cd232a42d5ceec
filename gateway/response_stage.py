"""The response stage: what every door does with an answer before its client reads it, and
with the finished request after — the use case's response guardrails on a whole answer, and
its record policy.

Written once and called by each door that answers: the synchronous path (gateway/app.py) and
the batcher that ends async tasks (scheduler/batcher/worker.py). A door that kept its own copy
could drift from it, and a control that one door skips is a control a client can walk around
(issue 24).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from gateway.accounting import Accounting, Content, Usage
from gateway.errors import GatewayError
from gateway.guardrail_plan import GuardPlan
from gateway.guardrails.fleet import Answered
from gateway.guardrails.run import Guardrails, Subject, blocked_message
from guardrails import confidence
from guardrails.texts import answer_slots


async def check_answer(
    guardrails: Guardrails,
    subject: Subject,
    *,
    path: str,
    guard: GuardPlan,
    body: bytes,
    document: Any,
    policy_version: int | None,
) -> bytes:
    """A whole (not streamed) answer through the use case's response checks: the body to
    send, redacted or as it was; a GatewayError when a check blocks it (422, naming the
    guardrail) or cannot run and the use case fails closed (503). ``document`` is the request,
    which some checks (groundedness) read beside the answer."""
    checks = guard.response
    if checks is None or path == "/v1/embeddings":  # an embedding answer has no text
        return body
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        # Not JSON (a transcript as plain text, an odd replica): the whole body is the text
        # checked, never let through unread.
        answer = {"text": body.decode("utf-8", "replace")}
        slots = [(answer, "text", "assistant")]
        plain = True
    else:
        slots = answer_slots(path, answer)
        plain = False
    # Logprobs the gateway asked for (gateway/app.py) are read here, then taken out again.
    stripped = guard.logprobs and not plain and not confidence.client_asked(path, document)
    if not slots:
        if stripped:
            confidence.strip(answer)
            return orjson.dumps(answer)
        return body
    texts = [container[key] for container, key, _ in slots]
    read = Answered(document, answer=answer) if guard.logprobs else document
    result = await guardrails.run(checks, texts, read)
    guardrails.record(
        subject,
        stage="response",
        findings=result.findings,
        failed=result.failed,
        failure=guard.failure,
        policy_version=policy_version,
    )
    if result.blocked is not None:
        raise GatewayError(
            422, blocked_message(result.blocked, "response"), code="guardrail_blocked"
        )
    if result.failed and guard.failure == "closed":
        raise guardrails.unavailable("response", result.failed)
    if stripped:
        confidence.strip(answer)
    elif result.texts == texts:
        return body
    for (container, key, _), text in zip(slots, result.texts, strict=True):
        container[key] = text
    return str(answer["text"]).encode() if plain else orjson.dumps(answer)


class Transcript(NamedTuple):
    """A full record's content: the request as forwarded and the answer as the client got
    it (each already cut to the capture limit), and whether either side was cut."""

    request: Content
    response: Content
    response_type: bytes
    truncated: bool


def keep_record(accounting: Accounting, usage: Usage, transcript: Transcript | None) -> Usage:
    """The finished request as its use case's record policy (``usage.record``) keeps it: the
    usage entry always (``none`` and ``metadata`` keep no content), and for ``full`` the
    transcript too — or, when it did not fit the buffer (or none was captured), the usage
    entry says ``full_dropped``. Buffered, no I/O; the usage as written is returned."""
    if usage.record == "full" and (
        transcript is None
        or not accounting.record_transcript(
            usage,
            request=transcript.request,
            response=transcript.response,
            response_type=transcript.response_type,
            truncated=transcript.truncated,
        )
    ):
        usage = usage._replace(record="full_dropped")
    accounting.append_usage(usage)
    return usage

"""One request at a door, as the front door makes it (gateway/front_door.py) and as it moves
through admission, the queue, the relay and the response stage (gateway/app.py); the async
door makes one per body to run the same request checks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.costs import Estimate
from gateway.guardrail_plan import GuardPlan
from gateway.policy import DEFAULT_RECORD_POLICY, Model, Principal, RecordPolicy
from gateway.records import Recorder
from gateway.scheduling import Grant, Ticket
from gateway.usage import UsageMeter
from runtime.multipart import Form


@dataclass(slots=True)
class Call:
    """One forwarded request as it moves through admission, the queue and the relay."""

    request_id: str
    request_id_bytes: bytes  # as it goes out in headers
    # The gateway's own id for this request (a client's X-Request-Id may repeat): what joins
    # its usage, decisions, findings and transcript; sent back as x-switchyard-record-id.
    record_id: str
    record_id_bytes: bytes
    principal: Principal
    model: Model
    path: str
    body: bytes
    document: dict[str, Any] | None
    form: Form | None  # a transcription's upload, parsed
    content_type: bytes
    streaming: bool
    estimate: Estimate  # admission's, before it runs (gateway/costs.py)
    strip_usage: bool = False  # the gateway asked for the stream's usage chunk, not the client
    rename_per_replica: bool = False  # the body is made at the grant (Model.served_names)
    forwarded: bool = False  # the body went to a replica (which may be running it)
    status: int = 500
    responded: bool = False  # the whole response is out; a disconnect now is not the client's
    ticket: Ticket | None = None
    admitted_ms: int = 0  # when the serving grant counted the rate limits (for reconcile)
    handler: asyncio.Task[Any] | None = None  # the task serving it, for interrupt()
    interrupted: str | None = None  # "client" (gone mid-request) or "timeout" (the model's)
    grant: Grant | None = None
    meter: UsageMeter | None = None
    upstream_s: float | None = None
    ttft_s: float | None = None
    deadline: float | None = None  # the model's timeout, on the loop's clock, for all attempts
    guard: GuardPlan | None = None  # the use case's guardrails, when it has any
    started: bool = False  # the response's head is out
    record: RecordPolicy = DEFAULT_RECORD_POLICY  # the use case's record policy
    recorder: Recorder | None = None  # a full record's capture of what the client gets
    request_sent: bytes | None = None  # a full record's request, as forwarded
    request_withheld: bool = False  # refused with a redaction unrun: no request content
    digests: asyncio.Future[dict[str, str]] | None = None  # a full record's upload hashes
    # Models still to try, in order, when this one refuses for capacity (issue 27).
    fallbacks: tuple[str, ...] = ()

    def interrupt(self, reason: str) -> None:
        """Cancel the serving task, once, unless the response is already out."""
        if self.interrupted is None and not self.responded and self.handler is not None:
            self.interrupted = reason
            self.handler.cancel()

    def uncancel(self) -> int:
        """Take back interrupt()'s cancellation; > 0 when someone else cancelled too."""
        assert self.handler is not None
        return self.handler.uncancel()

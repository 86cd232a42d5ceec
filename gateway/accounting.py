"""Usage and admission records, from the request path to the ``sy:usage`` / ``sy:decisions``
streams (persisted to the database by the ``scheduler.persist_usage`` Celery task).

The request path must never wait for, or fail because of, accounting: ``record_usage`` and
``record_decision`` are plain synchronous calls, made once the client has its answer, that
pack the record's ``XADD`` command (a few microseconds) into a bounded in-process buffer
and return. A background task flushes the buffer every
``flush_interval_s``: batches of those commands written at once over the gateway's
auto-pipelined connection (gateway/autopipeline.py). Packing at record time rather than at
flush time matters for latency: a flush then only joins bytes, where packing a 50 ms batch
(hundreds of records at a few microseconds each) held the event loop for a millisecond,
twenty times a second, and every request that arrived meanwhile waited.
While Valkey is down or slow the batch being written is kept and retried with backoff;
once the buffer is full, new records are dropped and counted (``dropped`` and the
``switchyard_gateway_accounting_dropped_total`` metric) — never blocked on.

Delivery is at most once per record in the normal case; a write whose reply is lost (a
timeout after Valkey applied it) is retried, so such a record can land twice.

The writer never trims the streams: a record the persister has not read yet must not be
lost because it lags (a ``MAXLEN`` here once dropped them silently). The persister trims
what its consumer group has acknowledged (records/usage.py). What it has not caught up
with is watched from here instead: every ``backlog_check_s`` each stream's length, unread
entries (the group's lag) and pending ones go to the gateway's metrics
(``switchyard_gateway_accounting_stream_{length,unread,pending}``), with one warning when
the unread ones pass ``backlog_warning``.

Stream entries (every value a string; the schema shared with records/usage.py):

- ``sy:usage``: ``USAGE_FIELDS`` — one per finished request; ``status`` is the HTTP status
  the client got (499: it went away), times are milliseconds, ``at_ms`` is when it finished.
- ``sy:decisions``: ``DECISION_FIELDS`` — refusals (``rejected``: over a limit,
  ``max_concurrent``, ``queue_full``; ``shed``: dropped from the queue at its deadline) and
  waits (``queued``, with ``wait_ms``). Immediate admissions are implied by usage and not
  written unless ``record_immediate_admissions`` is set.
- ``sy:records``: ``RECORD_FIELDS`` — the transcripts of ``full`` use cases
  (``record_transcript``). Their content has a byte budget of its own in the buffer
  (``content_budget_bytes``, counted from packing until written or dropped); a transcript
  that does not fit is not kept (the usage entry says ``full_dropped``), counted in
  ``switchyard_gateway_records_content_dropped_total`` and warned about once per
  ``content_warning_s`` — never waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

import orjson
import valkey
import valkey.asyncio as avalkey
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.autopipeline import Arg, AutoPipeline, auto_pipeline, bulk
from gateway.metrics import GatewayMetrics
from runtime.valkey_urls import VALKEY_FAILURES

_FAILED_OR_TIMED_OUT: tuple[type[BaseException], ...] = (*VALKEY_FAILURES, TimeoutError)

logger = logging.getLogger("gateway.accounting")

USAGE_STREAM: Final = "sy:usage"
DECISIONS_STREAM: Final = "sy:decisions"
# The persister's consumer group (records/usage.py): what it has not read is the backlog.
PERSISTER_GROUP: Final = "switchyard-persister"
BACKLOG_WARNING: Final = 100_000
# Transcript bytes the buffer may hold (SWITCHYARD_RECORD_BUFFER_BYTES): past it, content is
# dropped and the request kept as metadata.
CONTENT_BUDGET_BYTES: Final = 64 * 1024 * 1024

USAGE_FIELDS: Final = (
    "request_id",
    "at_ms",
    "tenant",
    "use_case_id",
    "key_id",
    "model",
    "replica",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "queued_ms",
    "upstream_ms",
    "total_ms",
    "policy_version",
    # Records (issue 12): the gateway's own id for the request (a client's may repeat), the
    # endpoint path, "1" for a streamed answer, and what the use case's record policy kept:
    # none | metadata | full | full_dropped (content not captured: the buffer was full).
    "record_id",
    "endpoint",
    "streamed",
    "record",
)
DECISION_FIELDS: Final = (
    "request_id",
    "at_ms",
    "decision",
    "reason",
    "tenant",
    "use_case_id",
    "key_id",
    "model",
    "wait_ms",
    "policy_version",
    "record_id",
    "retry_after_s",  # what a refusal's Retry-After said (0: none, or not a refusal)
)

# Guardrail findings (issue 11): one entry per guardrail that found something (or could not
# run) in one request's stage. ``action``: blocked | redacted | flagged | failed_open |
# failed_closed; ``entities``: a JSON object of entity type → count (never the text);
# ``stage``: request | response. Written by the gateway, persisted and rolled up by Celery.
GUARDRAILS_STREAM: Final = "sy:guardrails"
GUARDRAIL_FIELDS: Final = (
    "request_id",
    "at_ms",
    "tenant",
    "use_case_id",
    "key_id",
    "model",
    "stage",
    "guardrail",
    "action",
    "entities",
    "score",
    "policy_version",
    "record_id",
)

# Transcripts (issue 12): one entry per request of a ``full`` use case, self-contained (every
# usage field, so that either persister may create the InteractionRecord row first) plus the
# content: ``request`` (the body as forwarded, after request redaction), ``response`` (the
# bytes the client got, after response redaction; a stream's SSE bytes as sent),
# ``response_type`` (its content type) and ``truncated`` ("1" when either side was cut at the
# capture limit). Persisted into sealed objects by records/interactions.py, which trims entries
# soon after acknowledging them (content must not linger in Valkey).
RECORDS_STREAM: Final = "sy:records"
RECORD_FIELDS: Final = (*USAGE_FIELDS, "request", "response", "response_type", "truncated")
STREAMS: Final = (USAGE_STREAM, DECISIONS_STREAM, GUARDRAILS_STREAM, RECORDS_STREAM)

Decision = Literal["admitted", "queued", "rejected", "shed", "fallback"]
# Error replies that say "not now, not here" (a failover, a reshard, a replica missing
# under min-replicas-to-write), never "not this record": a batch that gets one is retried.
_TRANSIENT: Final = (
    "READONLY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "NOREPLICAS",
)  # fmt: skip
_Record = tuple[str, bytes]  # (stream, its XADD command packed)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _wire(value: object) -> bytes:
    """One field's value as a RESP bulk string."""
    if value is None:
        return b"$0\r\n\r\n"
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, bool):
        return b"$1\r\n1\r\n" if value else b"$1\r\n0\r\n"
    if isinstance(value, float):
        value = round(value)  # milliseconds: whole numbers are plenty
    return bulk(str(value))


class Content(NamedTuple):
    """A transcript's side as captured: its pieces (the chunks the client was sent), written
    into the command as they are — joined once, by the packer, never copied before."""

    parts: Sequence[bytes]
    size: int


class _XaddPacker:
    """One stream's ``XADD stream * field value …`` packed as RESP: the fixed part once, then
    each record's values in the stream's field order."""

    __slots__ = ("_fields", "_head")

    def __init__(self, stream: str, fields: tuple[str, ...]) -> None:
        fixed: tuple[Arg, ...] = ("XADD", stream, "*")
        count = len(fixed) + 2 * len(fields)
        self._head = b"*%d\r\n%s" % (count, b"".join([bulk(part) for part in fixed]))
        self._fields = tuple(bulk(field) for field in fields)

    def pack(self, values: Sequence[object]) -> bytes:
        parts = [self._head]
        for field, value in zip(self._fields, values, strict=True):
            if isinstance(value, Content):
                parts += (field, b"$%d\r\n" % value.size, *value.parts, b"\r\n")
            else:
                parts += (field, _wire(value))
        return b"".join(parts)


class Usage(NamedTuple):
    """One finished request's ``sy:usage`` entry, in ``USAGE_FIELDS`` order (a test holds
    them equal); also the first fields of its ``sy:records`` entry."""

    request_id: str
    at_ms: int
    tenant: str
    use_case_id: int
    key_id: int | None
    model: str
    replica: str | None
    status: int
    prompt_tokens: int
    completion_tokens: int
    queued_ms: float
    upstream_ms: float
    total_ms: float
    policy_version: int | None
    record_id: str = ""
    endpoint: str = ""
    streamed: bool = False
    record: str = "none"  # none | metadata | full | full_dropped


class Backlog(NamedTuple):
    """A stream as the persister's consumer group sees it."""

    length: int
    unread: int  # not yet delivered to the group (all of it when there is no group yet)
    pending: int  # delivered, not yet acknowledged


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {_str(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_backlog(length: int, groups: Sequence[Any] | Exception) -> Backlog:
    """``XLEN`` and ``XINFO GROUPS`` (RESP2 flat pairs) → the persister group's backlog."""
    if isinstance(groups, Exception):  # no such stream yet
        return Backlog(length, length, 0)
    for flat in groups:
        group = _pairs(flat)
        if _str(group.get("name")) == PERSISTER_GROUP:
            lag = group.get("lag")
            # lag is nil when Valkey cannot count it (entries deleted mid-stream): the
            # length is then the bound.
            unread = int(lag) if lag is not None else length
            return Backlog(length, unread, int(group.get("pending", 0)))
    return Backlog(length, length, 0)


class _BacklogCollector(Collector):
    """The streams' backlog as last checked, read at scrape time."""

    def __init__(self, accounting: Accounting) -> None:
        self._accounting = accounting

    def collect(self) -> Iterator[Metric]:
        helps = {
            "length": "Entries in the accounting stream (the persister trims what it has read).",
            "unread": "Entries of the accounting stream the persister has not read yet.",
            "pending": "Entries the persister read and has not acknowledged yet.",
        }
        for field, text in helps.items():
            family = GaugeMetricFamily(
                f"switchyard_gateway_accounting_stream_{field}", text, labels=["stream"]
            )
            for stream, backlog in sorted(self._accounting.backlog.items()):
                family.add_metric([stream], getattr(backlog, field))
            yield family


class Accounting:
    """The gateway process's accounting writer; one per process, ``start()`` in lifespan."""

    def __init__(
        self,
        client: avalkey.Valkey,
        *,
        metrics: GatewayMetrics | None = None,
        buffer_limit: int = 50_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        write_timeout_s: float = 1.0,
        backlog_check_s: float = 10.0,
        backlog_warning: int = BACKLOG_WARNING,
        record_immediate_admissions: bool = False,
        pipe: AutoPipeline | None = None,
        content_budget_bytes: int = CONTENT_BUDGET_BYTES,
        content_warning_s: float = 10.0,
        replicas: int = 0,
        replica_timeout_ms: int = 100,
    ) -> None:
        self._owns_pipe = pipe is None
        self._pipe = pipe if pipe is not None else auto_pipeline(client)
        # A batch leaves the buffer only once this many replicas have it (WAIT): a failover
        # then cannot lose a record (docs/valkey-ha.md). WAIT blocks its connection: give
        # this writer its own pipeline (pipe=None) when it is set.
        self._replicas = replicas
        self._replica_timeout_ms = replica_timeout_ms
        self._metrics = metrics
        self._buffer: deque[_Record] = deque()
        self._limit = buffer_limit
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._write_timeout_s = write_timeout_s
        self._packers = {
            USAGE_STREAM: _XaddPacker(USAGE_STREAM, USAGE_FIELDS),
            DECISIONS_STREAM: _XaddPacker(DECISIONS_STREAM, DECISION_FIELDS),
            GUARDRAILS_STREAM: _XaddPacker(GUARDRAILS_STREAM, GUARDRAIL_FIELDS),
            RECORDS_STREAM: _XaddPacker(RECORDS_STREAM, RECORD_FIELDS),
        }
        # Transcript content is the one thing here that can be large: it gets a byte budget
        # of its own, counted while its entries sit in the buffer (``content_bytes``).
        self._content_budget = content_budget_bytes
        self.content_bytes = 0
        self.content_dropped = 0
        self._content_warning_s = content_warning_s
        self._content_warn_at = 0.0
        self._content_unwarned = 0
        self._backlog_check_s = backlog_check_s
        self._backlog_warning = backlog_warning
        self.backlog: dict[str, Backlog] = {}
        self._backlogged: set[str] = set()  # streams warned about, until they catch up
        if metrics is not None:
            metrics.registry.register(_BacklogCollector(self))
        self._immediate = record_immediate_admissions
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._writing = False  # a batch's commands are out and their replies awaited
        self.dropped: dict[str, int] = dict.fromkeys(STREAMS, 0)
        self.written = 0
        self._healthy = True

    @property
    def pending(self) -> int:
        return len(self._buffer)

    # --- the request path: never awaits, never raises -------------------------------------
    def record_usage(
        self,
        *,
        request_id: str,
        tenant: str,
        use_case_id: int,
        key_id: int | None,
        model: str,
        replica: str | None,
        status: int,
        prompt_tokens: int,
        completion_tokens: int,
        queued_ms: float,
        upstream_ms: float,
        total_ms: float,
        policy_version: int | None,
        at_ms: int | None = None,
        record_id: str = "",
        endpoint: str = "",
        streamed: bool = False,
        record: str = "none",
    ) -> None:
        """One finished request (any status, including errors and client disconnects)."""
        self._append(
            USAGE_STREAM,
            Usage(
                request_id,
                _now_ms() if at_ms is None else at_ms,
                tenant,
                use_case_id,
                key_id,
                model,
                replica,
                status,
                prompt_tokens,
                completion_tokens,
                queued_ms,
                upstream_ms,
                total_ms,
                policy_version,
                record_id,
                endpoint,
                streamed,
                record,
            ),
        )

    def append_usage(self, usage: Usage) -> None:
        """``record_usage`` for a caller that built the entry already (the gateway, which
        also hands it to ``record_transcript``)."""
        self._append(USAGE_STREAM, usage)

    def record_transcript(
        self,
        usage: Usage,
        *,
        request: Content,
        response: Content,
        response_type: bytes,
        truncated: bool,
    ) -> bool:
        """A ``full`` use case's request and response, with its usage fields, for
        ``sy:records``. False when the content did not fit (the buffer's byte budget or its
        count limit): then nothing is kept, the drop is counted and warned about, and the
        caller's usage entry says ``full_dropped``."""
        size = request.size + response.size
        if len(self._buffer) >= self._limit or self._closing:
            self._drop_content("buffer_full")
            return False
        if self.content_bytes + size > self._content_budget:
            self._drop_content("buffer_bytes")
            return False
        try:
            command = self._packers[RECORDS_STREAM].pack(
                (*usage, request, response, response_type, truncated)
            )
        except Exception:
            logger.exception("records_transcript_dropped")
            self._drop_content("unpackable")
            return False
        self.content_bytes += len(command)
        self._buffer.append((RECORDS_STREAM, command))
        return True

    def _drop_content(self, reason: str) -> None:
        self.content_dropped += 1
        if self._metrics is not None:
            self._metrics.records_content_dropped(reason)
        # One line per interval with the count, not one per request: a full buffer under
        # load would otherwise write thousands a second.
        self._content_unwarned += 1
        now = time.monotonic()
        if now >= self._content_warn_at:
            logger.warning(
                "records_content_dropped count=%s reason=%s buffer_bytes=%s budget_bytes=%s "
                "(kept as metadata: record=full_dropped)",
                self._content_unwarned,
                reason,
                self.content_bytes,
                self._content_budget,
            )
            self._content_unwarned = 0
            self._content_warn_at = now + self._content_warning_s

    def _released(self, records: Iterable[_Record]) -> None:
        """Records that left the buffer for good (written or dropped): their content bytes
        go back to the budget."""
        for stream, command in records:
            if stream == RECORDS_STREAM:
                self.content_bytes -= len(command)

    def record_decision(
        self,
        *,
        request_id: str,
        decision: Decision,
        reason: str,
        tenant: str,
        use_case_id: int,
        key_id: int | None,
        model: str,
        wait_ms: float = 0,
        policy_version: int | None,
        at_ms: int | None = None,
        record_id: str = "",
        retry_after_s: int = 0,
    ) -> None:
        """One admission decision; ``reason`` names the limit or cause (``queue_full``…),
        ``retry_after_s`` the Retry-After a refusal answered."""
        if decision == "admitted" and not wait_ms and not self._immediate:
            return
        self._append(
            DECISIONS_STREAM,
            (
                request_id,
                _now_ms() if at_ms is None else at_ms,
                decision,
                reason,
                tenant,
                use_case_id,
                key_id,
                model,
                wait_ms,
                policy_version,
                record_id,
                retry_after_s,
            ),
        )

    def record_guardrail(
        self,
        *,
        request_id: str,
        tenant: str,
        use_case_id: int,
        key_id: int | None,
        model: str,
        stage: str,
        guardrail: str,
        action: str,
        entities: Mapping[str, int],
        score: float,
        policy_version: int | None,
        at_ms: int | None = None,
        record_id: str = "",
    ) -> None:
        """One guardrail's findings in one stage of a request, or its failure to run:
        entity types and counts only, never the text."""
        self._append(
            GUARDRAILS_STREAM,
            (
                request_id,
                _now_ms() if at_ms is None else at_ms,
                tenant,
                use_case_id,
                key_id,
                model,
                stage,
                guardrail,
                action,
                orjson.dumps(dict(entities)).decode(),
                # A score in [0, 1]: as text with its decimals (``_wire`` rounds floats).
                f"{float(score):.4f}",
                policy_version,
                record_id,
            ),
        )

    def _append(self, stream: str, values: Sequence[object]) -> None:
        if len(self._buffer) >= self._limit or self._closing:
            self._drop(stream, 1)
            return
        try:
            command = self._packers[stream].pack(values)
        except Exception:
            # Never the request's problem: a record that cannot be packed is dropped.
            logger.exception("accounting_record_dropped stream=%s", stream)
            self._drop(stream, 1)
            return
        self._buffer.append((stream, command))

    def _drop(self, stream: str, count: int) -> None:
        self.dropped[stream] = self.dropped.get(stream, 0) + count
        if self._metrics is not None:
            self._metrics.accounting_dropped(stream, count)

    # --- the background writer ------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="accounting-flush")

    async def close(self, timeout_s: float = 2.0) -> None:
        """Stop taking records, flush what Valkey takes within the timeout, drop the rest."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            if self._writing:
                # A batch is out: Valkey applies it whatever happens here, so cancelling the
                # wait for its replies would put records it has back in the buffer, to be
                # written twice. Let it finish (the loop stops after it), within the bound.
                await asyncio.wait({task}, timeout=timeout_s)
            task.cancel()
            await asyncio.wait({task}, timeout=timeout_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._buffer and await self.flush_once():
                    pass
        for stream, _ in self._buffer:
            self._drop(stream, 1)
        self._released(self._buffer)
        self._buffer.clear()
        if self._owns_pipe:
            await self._pipe.close()

    async def flush_once(self) -> bool:
        """Write one batch; returns False when Valkey failed (the batch is kept)."""
        batch = [self._buffer.popleft() for _ in range(min(self._batch_size, len(self._buffer)))]
        if not batch:
            return True
        try:
            self._writing = True
            # Waiting for replicas has no deadline: while the connection lives the batch is
            # on the primary, and writing it again would duplicate it. A hung server is
            # still caught (the pipeline's reply timeout drops the connection).
            async with asyncio.timeout(None if self._replicas else self._write_timeout_s):
                await self._write(batch)
        except _FAILED_OR_TIMED_OUT as exc:
            self._requeue(batch)
            if self._healthy:
                logger.warning("accounting_write_failed error=%s", exc.__class__.__name__)
            self._healthy = False
            return False
        except asyncio.CancelledError:
            self._requeue(batch)  # close() flushes it
            raise
        except Exception:
            # A bug, not Valkey: retrying would fail the same way. Drop the batch, loudly,
            # and keep the writer alive for the records after it.
            logger.exception("accounting_batch_dropped size=%s", len(batch))
            for stream, _ in batch:
                self._drop(stream, 1)
            self._released(batch)
            return True
        finally:
            self._writing = False
        self._released(batch)
        self.written += len(batch)
        if not self._healthy:
            logger.info("accounting_write_ok dropped=%s", sum(self.dropped.values()))
        self._healthy = True
        return True

    async def _write(self, batch: Sequence[_Record]) -> None:
        # A lost connection raises (the whole batch is retried); a record Valkey refused
        # would be refused again, so it alone is dropped.
        replies = await self._pipe.execute_packed(
            b"".join([c for _, c in batch]),
            len(batch),
            replicas=self._replicas,
            replica_timeout_ms=self._replica_timeout_ms,
        )
        for reply in replies:
            if isinstance(reply, valkey.ResponseError) and str(reply).startswith(_TRANSIENT):
                # Not a refusal of the record: the server is not (or no longer) the primary.
                # The whole batch is written again, to the primary found on reconnecting.
                raise valkey.ConnectionError(f"Valkey cannot take writes now: {reply}")
        for (stream, _), reply in zip(batch, replies, strict=True):
            if isinstance(reply, valkey.ResponseError):
                logger.error("accounting_record_refused stream=%s error=%s", stream, reply)
                self._drop(stream, 1)

    async def check_backlog(self) -> None:
        """Read each stream's backlog into ``backlog`` (the metrics); warn once when the
        persister is ``backlog_warning`` entries or more behind, and say when it caught up."""
        commands: list[tuple[Arg, ...]] = []
        for stream in STREAMS:
            commands += [("XLEN", stream), ("XINFO", "GROUPS", stream)]
        replies = await self._pipe.execute_many(commands)
        for index, stream in enumerate(STREAMS):
            length, groups = replies[2 * index], replies[2 * index + 1]
            if isinstance(length, Exception):
                raise length
            backlog = parse_backlog(int(length), groups)
            self.backlog[stream] = backlog
            if backlog.unread >= self._backlog_warning and stream not in self._backlogged:
                self._backlogged.add(stream)
                logger.warning(
                    "accounting_backlog stream=%s unread=%s pending=%s length=%s "
                    "(the usage persister is behind; nothing unread is trimmed)",
                    stream,
                    backlog.unread,
                    backlog.pending,
                    backlog.length,
                )
            elif backlog.unread < self._backlog_warning // 2 and stream in self._backlogged:
                self._backlogged.discard(stream)
                logger.info(
                    "accounting_backlog_cleared stream=%s unread=%s", stream, backlog.unread
                )

    def _requeue(self, batch: list[_Record]) -> None:
        # Older records go back to the front; whatever no longer fits is dropped, oldest last.
        room = max(0, self._limit - len(self._buffer))
        kept, lost = batch[:room], batch[room:]
        self._buffer.extendleft(reversed(kept))
        for stream, _ in lost:
            self._drop(stream, 1)
        self._released(lost)

    async def _run(self) -> None:
        backoff = self._flush_interval_s
        loop = asyncio.get_running_loop()
        check_at = loop.time()
        while not self._closing:
            await asyncio.sleep(backoff)
            ok = True
            while self._buffer and ok and not self._closing:
                ok = await self.flush_once()
            backoff = self._flush_interval_s if ok else min(1.0, max(backoff * 2, 0.05))
            if ok and loop.time() >= check_at and not self._closing:
                check_at = loop.time() + self._backlog_check_s
                try:
                    await self.check_backlog()
                except VALKEY_FAILURES as exc:
                    logger.debug("accounting_backlog_check_failed error=%r", exc)

"""The gateway's own Prometheus metrics: one registry per gateway process.

The request path calls the small methods below; each looks its labelled child up in a plain
dict first (``labels()`` takes a lock and builds a tuple every call), so recording a whole
finished request costs a few microseconds — see tests/gateway/test_metrics.py, which measures
it. ``render()`` gives the exposition bytes and content type for a ``GET /metrics`` handler.

Labels must stay bounded: ``model`` is a public model id from the policy (never the
client's unchecked string), ``replica`` a base URL from the policy, ``reason`` a kind of
refusal (``rate_limit``, ``max_concurrent``, ``queue_full``, ``queue_timeout``…), not a
tenant's limit name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

PREFIX = "switchyard_gateway_"

# Seconds. Upstream latency spans an embedding (milliseconds) to a thinking model (minutes).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
QUEUE_WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0,
)  # fmt: skip

# Tasks in one async submit call: a single one, or a bulk call of up to 1000 by default.
ASYNC_BULK_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)  # fmt: skip
# Seconds a long poll waited (``?wait=`` is at most 60).
ASYNC_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # fmt: skip

# Seconds: a regex check takes a millisecond with its round trip, a spaCy pass hundreds.
GUARDRAIL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

Decision = Literal["admitted", "queued", "rejected", "shed", "fallback"]
# How an async submit call ended (gateway/async_tasks/api.py).
AsyncSubmitOutcome = Literal[
    "accepted", "invalid", "blocked", "rate_limited", "backlog_full", "unavailable"
]
# How a long poll's wait ended: the task ended, the wait ran out, or the client left.
AsyncWaitOutcome = Literal["done", "timeout", "gone"]

_Child = TypeVar("_Child", Counter, Gauge, Histogram)


class _Children(dict[tuple[str, ...], _Child]):
    """A metric's labelled children, cached by label values."""

    def __init__(self, metric: _Child) -> None:
        super().__init__()
        self.metric: _Child = metric

    def __missing__(self, key: tuple[str, ...]) -> _Child:
        child: _Child = self.metric.labels(*key)
        self[key] = child
        return child


class _InFlight(Collector):
    """Requests in flight per (model, replica): plain integers on the request path (two
    changes a request; a locked Gauge child costs several times as much), read at scrape."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            PREFIX + "in_flight",
            "Requests this gateway process has in flight to each replica.",
            labels=["model", "replica"],
        )
        for (model, replica), count in sorted(self.counts.items()):
            family.add_metric([model, replica], count)
        yield family


class GatewayMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, *, process_collectors: bool = True
    ) -> None:
        self.registry = r = registry or CollectorRegistry()
        if process_collectors:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self._requests = _Children(
            Counter(
                PREFIX + "requests",
                "Requests answered, by model and HTTP status (499: the client went away).",
                ["model", "status"],
                registry=r,
            )
        )
        self._decisions = _Children(
            Counter(
                PREFIX + "admission_decisions",
                "Admission decisions, by decision and reason.",
                ["decision", "reason"],
                registry=r,
            )
        )
        self._fallbacks = _Children(
            Counter(
                PREFIX + "fallbacks",
                "Requests a model refused for capacity that a fallback model served or was "
                "asked to, by model, fallback and reason.",
                ["model", "fallback", "reason"],
                registry=r,
            )
        )
        self._queue_depth = _Children(
            Gauge(
                PREFIX + "queue_depth",
                "Requests waiting in the model's queue, per priority class.",
                ["model", "priority_class"],
                registry=r,
            )
        )
        self._queue_wait = _Children(
            Histogram(
                PREFIX + "queue_wait_seconds",
                "Time a request waited in the queue before a grant or giving up.",
                ["model", "priority_class"],
                buckets=QUEUE_WAIT_BUCKETS,
                registry=r,
            )
        )
        self._upstream = _Children(
            Histogram(
                PREFIX + "upstream_latency_seconds",
                "From sending to the replica to the last byte of its answer.",
                ["model"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self._ttft = _Children(
            Histogram(
                PREFIX + "time_to_first_token_seconds",
                "From sending to the replica to its first streamed byte.",
                ["model"],
                buckets=TTFT_BUCKETS,
                registry=r,
            )
        )
        self._tokens = _Children(
            Counter(
                PREFIX + "tokens",
                "Tokens served, by model and kind (prompt or completion).",
                ["model", "kind"],
                registry=r,
            )
        )
        self._in_flight = _InFlight()
        r.register(self._in_flight)
        self._dropped = _Children(
            Counter(
                PREFIX + "accounting_dropped",
                "Accounting stream entries dropped because Valkey could not take them.",
                ["stream"],
                registry=r,
            )
        )

        self._records = _Children(
            Counter(
                PREFIX + "records",
                "Forwarded requests by what their use case's record policy kept: none, "
                "metadata, full, or full_dropped (content not kept: the buffer was full).",
                ["record"],
                registry=r,
            )
        )
        self._content_dropped = _Children(
            Counter(
                PREFIX + "records_content_dropped",
                "Transcripts of full-record use cases whose content was not kept, by reason "
                "(buffer_bytes: the byte budget; buffer_full: the record count limit).",
                ["reason"],
                registry=r,
            )
        )

        self._guardrail_findings = _Children(
            Counter(
                PREFIX + "guardrail_findings",
                "Guardrail findings and failures, by guardrail, stage and action (blocked, "
                "redacted, flagged, failed_open, failed_closed).",
                ["guardrail", "stage", "action"],
                registry=r,
            )
        )
        self._guardrail_latency = _Children(
            Histogram(
                PREFIX + "guardrail_check_seconds",
                "Time a stage's guardrail checks took (the service's and the fleet's).",
                ["stage"],
                buckets=GUARDRAIL_BUCKETS,
                registry=r,
            )
        )

        self._async_submits = _Children(
            Counter(
                PREFIX + "async_submits",
                "Async submit calls, by outcome (accepted, invalid, blocked, rate_limited, "
                "backlog_full, unavailable).",
                ["outcome"],
                registry=r,
            )
        )
        self._async_bulk = Histogram(
            PREFIX + "async_submit_tasks",
            "Tasks per accepted async submit call (1 for a single submit); its sum is the "
            "tasks accepted.",
            buckets=ASYNC_BULK_BUCKETS,
            registry=r,
        )
        self._async_polls = _Children(
            Counter(
                PREFIX + "async_polls",
                "Task polls, by what they found (found, not_found) and whether they waited.",
                ["result", "wait"],
                registry=r,
            )
        )
        self._async_waits = _Children(
            Histogram(
                PREFIX + "async_long_poll_wait_seconds",
                "How long long polls waited, by how the wait ended (done, timeout, gone).",
                ["outcome"],
                buckets=ASYNC_WAIT_BUCKETS,
                registry=r,
            )
        )

        self._async_waiting = Gauge(
            PREFIX + "async_long_polls_waiting",
            "Long polls waiting for their task to end now.",
            registry=r,
        )

    # --- the request path -----------------------------------------------------------------
    def request_finished(
        self,
        *,
        model: str,
        status: int,
        upstream_s: float | None = None,
        ttft_s: float | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """One answered request; latencies are None when it never reached a replica."""
        self._requests[(model, str(status))].inc()
        if upstream_s is not None:
            self._upstream[(model,)].observe(upstream_s)
        if ttft_s is not None:
            self._ttft[(model,)].observe(ttft_s)
        if prompt_tokens:
            self._tokens[(model, "prompt")].inc(prompt_tokens)
        if completion_tokens:
            self._tokens[(model, "completion")].inc(completion_tokens)

    def fell_back(self, *, model: str, fallback: str, reason: str) -> None:
        """A request its model refused for capacity, moved to a fallback (issue 27)."""
        self._fallbacks[(model, fallback, reason)].inc()

    def admission_decided(self, decision: Decision, reason: str = "") -> None:
        self._decisions[(decision, reason)].inc()

    def queue_waited(self, *, model: str, priority_class: str, seconds: float) -> None:
        self._queue_wait[(model, priority_class)].observe(seconds)

    def set_queue_depth(self, *, model: str, priority_class: str, depth: int) -> None:
        self._queue_depth[(model, priority_class)].set(depth)

    def in_flight_changed(self, *, model: str, replica: str, delta: int) -> None:
        """+1 when a request is sent to a replica, −1 when it is released."""
        counts = self._in_flight.counts
        key = (model, replica)
        counts[key] = counts.get(key, 0) + delta

    def guardrail_found(self, *, guardrail: str, stage: str, action: str) -> None:
        self._guardrail_findings[(guardrail, stage, action)].inc()

    def guardrail_checked(self, stage: str, seconds: float) -> None:
        self._guardrail_latency[(stage,)].observe(seconds)

    def accounting_dropped(self, stream: str, count: int = 1) -> None:
        self._dropped[(stream,)].inc(count)

    def record_kept(self, record: str) -> None:
        """One forwarded request, by what its record policy kept."""
        self._records[(record,)].inc()

    def records_content_dropped(self, reason: str) -> None:
        self._content_dropped[(reason,)].inc()

    def async_submitted(self, outcome: AsyncSubmitOutcome, tasks: int) -> None:
        """One async submit call of ``tasks`` bodies and how it ended."""
        self._async_submits[(outcome,)].inc()
        if outcome == "accepted":
            self._async_bulk.observe(tasks)

    def async_polled(self, *, found: bool, waited: bool) -> None:
        self._async_polls[("found" if found else "not_found", "yes" if waited else "no")].inc()

    def watch_long_polls(self, waiting: Callable[[], float]) -> None:
        """Read the long polls waiting from ``waiting`` at scrape time."""
        self._async_waiting.set_function(waiting)

    def async_waited(self, outcome: AsyncWaitOutcome, seconds: float) -> None:
        self._async_waits[(outcome,)].observe(seconds)

    # --- exposition -----------------------------------------------------------------------
    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition for ``GET /metrics``: (body, content type), negotiated on Accept
        (Prometheus text by default, OpenMetrics when the scraper asks for it)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

"""The batcher's Prometheus metrics, on SWITCHYARD_BATCHER_METRICS_PORT (0: not served)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256)
_RATIOS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class BatcherMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.batch_size = Histogram(
            "switchyard_batcher_batch_size", "Tasks per flushed batch.", ["model"],
            buckets=_SIZES, registry=r,
        )  # fmt: skip
        self.fill_ratio = Histogram(
            "switchyard_batcher_batch_fill_ratio",
            "A flushed batch's tasks over the model's batch size.", ["model"],
            buckets=_RATIOS, registry=r,
        )  # fmt: skip
        self.flushes = Counter(
            "switchyard_batcher_flushes", "Batches flushed, by why: full, window or stop.",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.window = Histogram(
            "switchyard_batcher_window_seconds", "The adaptive window at each flush.",
            ["model"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.wait = Histogram(
            "switchyard_batcher_wait_seconds",
            "Added batching wait: a task's time in a buffer before its batch left.",
            ["model"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.depth = Gauge(
            "switchyard_batcher_queue_depth", "Entries in a partition stream (unread or pending).",
            ["stream"], registry=r,
        )  # fmt: skip
        self.oldest_age = Gauge(
            "switchyard_batcher_queue_oldest_age_seconds",
            "Age of a partition stream's oldest entry.", ["stream"], registry=r,
        )  # fmt: skip
        self.ended = Counter(
            "switchyard_batcher_tasks_ended", "Tasks ended, by terminal state.",
            ["model", "state"], registry=r,
        )  # fmt: skip
        self.collapsed = Counter(
            "switchyard_batcher_tasks_collapsed",
            "Tasks answered by another task's computation or the result cache.",
            ["model", "source"], registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "switchyard_batcher_task_retries", "Failed attempts that will be tried again.",
            ["model"], registry=r,
        )  # fmt: skip
        self.fallbacks = Counter(
            "switchyard_batcher_fallbacks",
            "Tasks a model refused for capacity that a fallback model was asked to serve.",
            ["model", "fallback"], registry=r,
        )  # fmt: skip
        self.dlq_size = Gauge(
            "switchyard_batcher_dead_letters", "Entries in the dead-letter stream.", registry=r
        )
        self.upstream_calls = Counter(
            "switchyard_batcher_upstream_calls", "Calls to the fleet, by outcome.",
            ["model", "endpoint", "outcome"], registry=r,
        )  # fmt: skip

        # The response stage on async answers (gateway/guardrails/run.py reports through these).
        self.guardrail_findings = Counter(
            "switchyard_batcher_guardrail_findings",
            "Response guardrail findings and failures on async answers, by guardrail, stage "
            "and action.", ["guardrail", "stage", "action"], registry=r,
        )  # fmt: skip
        self.guardrail_latency = Histogram(
            "switchyard_batcher_guardrail_check_seconds",
            "Time a stage's guardrail checks took on async answers.", ["stage"],
            buckets=_SECONDS, registry=r,
        )  # fmt: skip

    def guardrail_found(self, *, guardrail: str, stage: str, action: str) -> None:
        self.guardrail_findings.labels(guardrail, stage, action).inc()

    def guardrail_checked(self, stage: str, seconds: float) -> None:
        self.guardrail_latency.labels(stage).observe(seconds)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        if port > 0:
            start_http_server(port, addr=host, registry=self.registry)

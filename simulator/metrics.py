"""vLLM's Prometheus metrics, by vLLM's names, help texts, labels and buckets (vLLM 0.32).

The fleet watcher scrapes these from every replica, so they must read exactly as vLLM's
do. Each simulator instance has its own registry: several can live in one test process.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

# vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
LABELS = ["model_name", "engine"]


class SimulatorMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        values = self._values = (model_name, "0")
        r = self.registry
        # vLLM serves the default registry, so its scrape starts with these families.
        GCCollector(registry=r)
        PlatformCollector(registry=r)
        ProcessCollector(registry=r)

        self._running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self._waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self._waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*LABELS, "reason"], registry=r,
        )  # fmt: skip
        self._waiting_by_reason.labels(*values, "capacity")
        self._waiting_by_reason.labels(*values, "deferred")  # never: no LoRA, no KV transfer
        sleep_state = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            [*LABELS, "sleep_state"], registry=r,
        )  # fmt: skip
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep_state.labels(*values, state).set(value)
        self._kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self.num_preemptions = Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r
        ).labels(*values)
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*LABELS, "source"], registry=r,
        )  # fmt: skip
        self.prompt_tokens_computed = by_source.labels(*values, "local_compute")
        self.prompt_tokens_from_cache = by_source.labels(*values, "local_cache_hit")
        by_source.labels(*values, "external_kv_transfer")
        self.prompt_tokens_cached = Counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            LABELS, registry=r,
        ).labels(*values)  # fmt: skip
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"], registry=r,
        )  # fmt: skip
        # vLLM creates every finished_reason series up front, so they read 0 before use.
        self.request_success = {
            reason: success.labels(*values, reason) for reason in FINISH_REASONS
        }
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS, registry=r, buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
        ).labels(*values)  # fmt: skip
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS, registry=r, buckets=INTER_TOKEN_LATENCY_BUCKETS,
        ).labels(*values)  # fmt: skip
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS, registry=r, buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(*values)  # fmt: skip
        self.request_queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LABELS, registry=r, buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(*values)  # fmt: skip

    def bind_scheduler_state(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        kv_usage: Callable[[], float],
    ) -> None:
        """Read the gauges from the engine at scrape time, so they are never stale."""
        self._running.set_function(running)
        self._waiting.set_function(waiting)
        self._waiting_by_reason.labels(*self._values, "capacity").set_function(waiting)
        self._kv_usage.set_function(kv_usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)

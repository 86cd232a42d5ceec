"""The gateway's /metrics: the families an operator's dashboards rely on, with their labels,
and a per-request recording cost small enough for the hot path."""

from __future__ import annotations

import subprocess
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from config.processes import PYTHON, REPO_ROOT
from gateway.metrics import GatewayMetrics

MODEL = "llama-test"
REPLICA = "http://10.0.0.5:8000"


def samples(metrics: GatewayMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def one_request(metrics: GatewayMetrics) -> None:
    metrics.admission_decided("admitted")
    metrics.in_flight_changed(model=MODEL, replica=REPLICA, delta=1)
    metrics.request_finished(
        model=MODEL,
        status=200,
        upstream_s=0.42,
        ttft_s=0.05,
        prompt_tokens=120,
        completion_tokens=30,
    )
    metrics.in_flight_changed(model=MODEL, replica=REPLICA, delta=-1)


def test_the_exposition_has_every_family_with_its_labels() -> None:
    metrics = GatewayMetrics()
    one_request(metrics)
    metrics.request_finished(model=MODEL, status=429)
    metrics.admission_decided("rejected", "rate_limit")
    metrics.admission_decided("queued", "no_capacity")
    metrics.queue_waited(model=MODEL, priority_class="prod", seconds=0.8)
    metrics.set_queue_depth(model=MODEL, priority_class="prod", depth=4)
    metrics.in_flight_changed(model=MODEL, replica=REPLICA, delta=1)
    metrics.accounting_dropped("sy:usage", 3)

    found = samples(metrics)
    p = "switchyard_gateway_"
    assert sorted(found[p + "requests_total"], key=str) == [
        ({"model": MODEL, "status": "200"}, 1.0),
        ({"model": MODEL, "status": "429"}, 1.0),
    ]
    assert ({"decision": "rejected", "reason": "rate_limit"}, 1.0) in found[
        p + "admission_decisions_total"
    ]
    assert ({"decision": "queued", "reason": "no_capacity"}, 1.0) in found[
        p + "admission_decisions_total"
    ]
    assert found[p + "queue_depth"] == [({"model": MODEL, "priority_class": "prod"}, 4.0)]
    assert ({"model": MODEL, "priority_class": "prod"}, 1.0) in found[
        p + "queue_wait_seconds_count"
    ]
    assert ({"model": MODEL, "priority_class": "prod", "le": "1.0"}, 1.0) in found[
        p + "queue_wait_seconds_bucket"
    ]
    assert found[p + "upstream_latency_seconds_count"] == [({"model": MODEL}, 1.0)]
    assert found[p + "upstream_latency_seconds_sum"] == [({"model": MODEL}, 0.42)]
    assert found[p + "time_to_first_token_seconds_count"] == [({"model": MODEL}, 1.0)]
    assert sorted(found[p + "tokens_total"], key=str) == [
        ({"model": MODEL, "kind": "completion"}, 30.0),
        ({"model": MODEL, "kind": "prompt"}, 120.0),
    ]
    assert found[p + "in_flight"] == [({"model": MODEL, "replica": REPLICA}, 1.0)]
    assert found[p + "accounting_dropped_total"] == [({"stream": "sy:usage"}, 3.0)]
    assert "process_resident_memory_bytes" in found


def test_openmetrics_is_served_to_a_scraper_that_asks_for_it() -> None:
    metrics = GatewayMetrics(process_collectors=False)
    one_request(metrics)
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert b'switchyard_gateway_requests_total{model="llama-test",status="200"} 1.0' in body


def test_recording_a_request_costs_a_few_microseconds() -> None:
    """The micro-benchmark behind the claim in gateway/metrics.py (printed with -s)."""
    metrics = GatewayMetrics(process_collectors=False)
    rounds = 20_000
    one_request(metrics)  # children created once, as after the first request of a model

    started = time.perf_counter()
    for _ in range(rounds):
        one_request(metrics)
    cached_us = (time.perf_counter() - started) / rounds * 1e6

    # The same work through labels() on every call, as naive code would do it.
    r = CollectorRegistry()
    requests = Counter("r", "", ["model", "status"], registry=r)
    decisions = Counter("d", "", ["decision", "reason"], registry=r)
    upstream = Histogram("u", "", ["model"], registry=r)
    ttft = Histogram("t", "", ["model"], registry=r)
    tokens = Counter("k", "", ["model", "kind"], registry=r)
    in_flight = Gauge("i", "", ["model", "replica"], registry=r)
    started = time.perf_counter()
    for _ in range(rounds):
        decisions.labels("admitted", "").inc()
        in_flight.labels(MODEL, REPLICA).inc(1)
        requests.labels(MODEL, "200").inc()
        upstream.labels(MODEL).observe(0.42)
        ttft.labels(MODEL).observe(0.05)
        tokens.labels(MODEL, "prompt").inc(120)
        tokens.labels(MODEL, "completion").inc(30)
        in_flight.labels(MODEL, REPLICA).inc(-1)
    naive_us = (time.perf_counter() - started) / rounds * 1e6

    print(f"\nmetrics per request: cached children {cached_us:.2f} µs, labels() {naive_us:.2f} µs")
    assert cached_us < 100  # ~5–7 µs on an idle machine; generous for a loaded CI runner


def test_the_gateway_side_modules_load_neither_django_nor_celery() -> None:
    """metrics, accounting and the fleet watcher run in Django-free gateway processes."""
    probe = (
        "import sys, gateway.metrics, gateway.accounting, gateway.fleet_watcher; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [PYTHON, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"imported: {result.stdout}{result.stderr}"

"""The gateway's /metrics: the families an operator's dashboards rely on, with their labels,
recorded through cached children on the hot path."""

from __future__ import annotations

import subprocess

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from ops.processes import PYTHON, REPO_ROOT

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


def test_after_a_models_first_request_recording_creates_no_label_children(
    monkeypatch,
) -> None:
    """The hot path's metrics use cached children: after a model's first request, recording
    never goes through ``labels()`` again (what that saves in µs: bench/gateway/recording.py)."""
    metrics = GatewayMetrics(process_collectors=False)
    one_request(metrics)  # children created once, as after the first request of a model
    calls: list[tuple[object, ...]] = []
    real_labels = MetricWrapperBase.labels

    def counting_labels(self, *values, **kw):
        calls.append(values)
        return real_labels(self, *values, **kw)

    monkeypatch.setattr(MetricWrapperBase, "labels", counting_labels)
    for _ in range(100):
        one_request(metrics)
    assert calls == []
    assert samples(metrics)["switchyard_gateway_requests_total"] == [
        ({"model": MODEL, "status": "200"}, 101.0)
    ]


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

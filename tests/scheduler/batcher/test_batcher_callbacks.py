"""An async task's end told to its callback URL: the batcher enqueues the delivery, a real
Celery worker signs and POSTs it (scheduler.deliver_task_webhook), a real receiver verifies.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import valkey

from governance.audit import Actor
from ops.processes import wait_until
from scheduler.files.webhook_settings import webhook_set
from testkit.async_tasks import now_ms, submit, wait_ended
from testkit.factories import make_model, make_tenant, make_use_case
from testkit.file_jobs_world import (
    RECEIVER_ENV,
    WebhookReceiver,
    allow_receivers,
    verify_standard_webhook,
)
from testkit.policy import PolicyBuilder
from tests.conftest import BatcherFactory, CeleryWorkerFactory, SimulatorFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_that_ends_calls_back_signed_with_its_use_case_secret(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_batcher: BatcherFactory,
    start_celery_worker: CeleryWorkerFactory,
    settings: Any,
) -> None:
    """GIVEN acme's "search" use case with a webhook secret WHEN a task submitted with a
    callback URL ends done, and another ends expired THEN each URL gets one event, signed
    with the use case's secret, carrying the task's view without its result."""
    embed = start_simulator("embed", "--kind", "embedding", "--time-scale", "0")
    model = make_model("embed", capabilities=["embeddings"])
    use_case = make_use_case(make_tenant("acme"), "search", models=(model,))
    builder = PolicyBuilder().model("embed", [embed.base_url], capabilities=("embeddings",))
    # Approved, as governance publishes it: a use case left out of the snapshot is suspended
    # or retired, and the batcher runs none of its tasks.
    builder.use_cases[str(use_case.pk)] = {
        "tenant": "acme", "slug": "search", "guardrails": [],
        "limits": {"requests_per_minute": None, "tokens_per_minute": None, "tokens_per_day": None},
    }  # fmt: skip
    builder.publish(valkey_client)
    allow_receivers(settings)  # the receiver is on loopback: the operator allows it
    with WebhookReceiver() as receiver:
        secret = webhook_set(actor=Actor.system("tests"), use_case=use_case, url=receiver.url)
        assert secret is not None
        start_celery_worker(**RECEIVER_ENV)
        start_batcher()
        common = {"model": "embed", "endpoint": "/v1/embeddings", "use_case_id": use_case.pk}
        done = submit(
            valkey_client, body={"input": "call me"}, callback_url=receiver.url + "/done",
            **common,  # type: ignore[arg-type]
        )  # fmt: skip
        late = submit(
            valkey_client, body={"input": "too late"}, callback_url=receiver.url + "/late",
            deadline_ms=now_ms() - 1, **common,  # type: ignore[arg-type]
        )  # fmt: skip
        views = wait_ended(valkey_client, [done, late])
        assert [v["status"] for v in views] == ["done", "expired"]
        assert wait_until(lambda: len(receiver.received) >= 2, timeout=30)
    events = {}
    for headers, body in receiver.received:
        assert verify_standard_webhook(secret, headers, body)
        event = orjson.loads(body)
        events[event["data"]["id"]] = (headers, event)
    assert set(events) == {done, late}
    headers, event = events[done]
    assert event["type"] == "task.done"
    assert headers["webhook-id"] == f"msg_{done}_done"
    assert event["data"]["status"] == "done"
    assert event["data"]["status_code"] == 200
    assert "result" not in event["data"]
    _, expired = events[late]
    assert expired["type"] == "task.expired"
    assert expired["data"]["error"]["code"] == "task_expired"
    assert len(receiver.received) == 2

"""Celery and the Channels layer by a Sentinel URL (runtime/valkey_urls.py): a task round
trip through a real worker whose broker and result backend are found through the sentinels,
a Channels message through channels-valkey's Sentinel pool; and with a Cluster as
SWITCHYARD_VALKEY_URL, Django's settings refuse to start unless Celery and Channels get a
URL of their own."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, current_app
from channels_valkey.core import ValkeyChannelLayer

from ops.processes import PYTHON, ManagedProcess
from runtime.valkey_urls import celery_broker, for_channels
from testkit.valkey_ha import SentinelSet


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    valkeys = SentinelSet(tmp_path_factory.mktemp("sentinel-clients"))
    try:
        yield valkeys.start()
    finally:
        valkeys.stop()


def test_a_celery_task_round_trips_through_a_sentinel_managed_broker(
    sentinel_set: SentinelSet, tmp_path: Path
) -> None:
    worker = ManagedProcess(
        "celery-sentinel",
        [PYTHON, "-m", "celery", "-A", "config.celery", "worker", "--pool", "solo",
         "--loglevel", "INFO", "--hostname", "sentinel-worker@%h",
         "--without-mingle", "--without-gossip", "--without-heartbeat"],
        env={"SWITCHYARD_VALKEY_URL": sentinel_set.url, "SWITCHYARD_RUN_DIR": str(tmp_path)},
    )  # fmt: skip
    worker.start(ready=lambda: "ready." in worker.log_text(), timeout=60)
    broker, options = celery_broker(sentinel_set.url)
    assert broker.startswith("sentinel://")
    assert options == {"master_name": sentinel_set.name}
    # An app of its own: the project's app may already hold a connection pool to another
    # broker in this test process (other tests ran here before), which a config update
    # would not replace. Not the current app either: @shared_task's .delay() in later tests
    # of this process would publish through these sentinels after they are stopped.
    client = Celery("sentinel-client", broker=broker, backend=broker, set_as_current=False)
    client.conf.update(broker_transport_options=options, result_backend_transport_options=options)
    try:
        result = client.send_task("scheduler.ping", args=["through sentinel"])
        answer = result.get(timeout=30)
        assert answer["pong"] == "through sentinel"
        assert "scheduler.ping" in worker.log_text()
    finally:
        client.close()
        worker.stop()
    assert current_app.main != "sentinel-client"


def test_a_channels_message_goes_through_a_sentinel_managed_layer(
    sentinel_set: SentinelSet,
) -> None:
    async def round_trip() -> dict[str, str]:
        layer = ValkeyChannelLayer(hosts=for_channels(sentinel_set.url))
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "fleet.update", "text": "hello"})
        message = await layer.receive(channel)
        await layer.flush()
        return message

    assert asyncio.run(round_trip())["text"] == "hello"


def _settings_error(**env: str) -> str:
    """Import Django's settings in a fresh process with ``env``; its stderr."""
    done = subprocess.run(
        [PYTHON, "-c", "import django, os; django.setup()"],
        env={"DJANGO_SETTINGS_MODULE": "config.settings", "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stderr if done.returncode else ""


def test_a_cluster_url_needs_its_own_broker_and_channels_urls() -> None:
    cluster = "valkey+cluster://127.0.0.1:7000,127.0.0.1:7001"
    # Alone: refused, naming the setting that fixes it.
    assert "SWITCHYARD_CELERY_BROKER_URL" in _settings_error(SWITCHYARD_VALKEY_URL=cluster)
    # With the broker's own URL, the Channels layer is next.
    refusal = _settings_error(
        SWITCHYARD_VALKEY_URL=cluster, SWITCHYARD_CELERY_BROKER_URL="valkey://127.0.0.1:6390/1"
    )
    assert "SWITCHYARD_CHANNELS_VALKEY_URL" in refusal
    # With both: the settings load.
    assert (
        _settings_error(
            SWITCHYARD_VALKEY_URL=cluster,
            SWITCHYARD_CELERY_BROKER_URL="valkey://127.0.0.1:6390/1",
            SWITCHYARD_CHANNELS_VALKEY_URL="valkey+sentinel://127.0.0.1:26379/sy/2",
        )
        == ""
    )

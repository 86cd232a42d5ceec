"""The image's entrypoint (ops/role.py): each role starts as `make up` starts it, and the
probes the manifests use answer from the real processes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
import valkey

from ops.processes import (
    PYTHON,
    REPO_ROOT,
    ManagedProcess,
    free_port,
    gateway_command,
    http_ready,
    wait_until,
)
from ops.role import ROLES, role_command
from testkit.policy import PolicyBuilder
from tests.conftest import SimulatorFactory


def role_process(role: str, env: dict[str, str]) -> ManagedProcess:
    return ManagedProcess(role, [PYTHON, "-m", "ops.role", role], env=env)


def probe(role: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "ops.role", "probe", role],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unknown_role_is_refused_with_the_list() -> None:
    result = subprocess.run(
        [PYTHON, "-m", "ops.role", "webb"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "celery-beat" in result.stderr
    with pytest.raises(ValueError, match="unknown role"):
        role_command("webb", host="0.0.0.0")


def test_every_role_has_a_command_and_the_gateway_is_the_tested_one() -> None:
    assert all(role_command(role, host="0.0.0.0") for role in ROLES)
    assert role_command("gateway", host="0.0.0.0", port=8080) == gateway_command("0.0.0.0", 8080)


def test_the_web_role_answers_its_probes_by_pod_ip_and_readiness_follows_the_database(
    tmp_path: Path,
) -> None:
    """GIVEN the web role started through the entrypoint, probed with a pod IP as its Host
    THEN /healthz and /readyz answer 200 while Django itself refuses that host, and a web
    process whose database is unreachable is live but not ready."""
    port = free_port()
    env = {
        "SWITCHYARD_RUN_DIR": str(tmp_path),
        "SWITCHYARD_WEB_PORT": str(port),
        "SWITCHYARD_BIND_HOST": "127.0.0.1",
        "SWITCHYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'web.sqlite3'}",
    }
    pod_ip = {"Host": "10.244.1.17:8000"}
    url = f"http://127.0.0.1:{port}"
    web = role_process("web", env)
    web.start(ready=http_ready(url + "/healthz", expect=200), timeout=60)
    try:
        assert httpx.get(url + "/healthz", headers=pod_ip).status_code == 200
        assert httpx.get(url + "/readyz", headers=pod_ip).status_code == 200
        assert httpx.get(url + "/accounts/login/", headers=pod_ip).status_code == 400
    finally:
        web.stop()

    unreachable = {**env, "SWITCHYARD_DATABASE_URL": f"postgres://nobody@127.0.0.1:{free_port()}/x"}
    web = role_process("web", unreachable)
    web.start(ready=http_ready(url + "/healthz", expect=200), timeout=60)
    try:
        ready = httpx.get(url + "/readyz", headers=pod_ip, timeout=30)
        assert (ready.status_code, ready.text) == (503, "database unreachable\n")
    finally:
        web.stop()


def test_the_fleet_watcher_probe_passes_only_while_a_watcher_writes(
    valkey_client: valkey.Valkey, valkey_url: str, start_simulator: SimulatorFactory
) -> None:
    env = {"SWITCHYARD_VALKEY_URL": valkey_url, "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1"}
    replica = start_simulator("sim-chat")
    PolicyBuilder().model("sim-chat", [replica.base_url]).publish(valkey_client)

    before = probe("fleet-watcher", env)
    assert (before.returncode, before.stderr) == (1, "fleet-watcher: no fleet watcher heartbeat\n")

    watcher = role_process("fleet-watcher", env)
    watcher.start()
    try:
        assert wait_until(lambda: probe("fleet-watcher", env).returncode == 0, timeout=30)
    finally:
        watcher.stop()


def test_the_beat_probe_passes_once_beat_has_saved_its_schedule(
    tmp_path: Path, valkey_url: str
) -> None:
    env = {"SWITCHYARD_VALKEY_URL": valkey_url, "SWITCHYARD_RUN_DIR": str(tmp_path)}
    before = probe("celery-beat", env)
    assert before.returncode == 1
    assert "no beat schedule" in before.stderr

    beat = role_process("celery-beat", env)
    beat.start()
    try:
        assert wait_until(lambda: probe("celery-beat", env).returncode == 0, timeout=60)
    finally:
        beat.stop()


def test_the_worker_probe_pings_the_worker_of_its_own_pod(tmp_path: Path, valkey_url: str) -> None:
    """The probe asks worker@<this host> by name: a ping answered by another pod's worker
    would keep a wedged one alive."""
    env = {
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_RUN_DIR": str(tmp_path),
        "SWITCHYARD_CELERY_CONCURRENCY": "1",
    }
    assert probe("celery-worker", env).returncode == 1  # none runs yet

    worker = role_process("celery-worker", env)
    worker.start(ready=lambda: "ready." in worker.log_text(), timeout=60)
    try:
        assert wait_until(lambda: probe("celery-worker", env).returncode == 0, timeout=60)
    finally:
        worker.stop()


def test_the_batcher_serves_its_probe_route_beyond_loopback_when_told(
    valkey_url: str,
) -> None:
    """The kubelet probes the pod's IP: a listener on 127.0.0.1 alone would fail it, one on
    0.0.0.0 answers on any address (here 127.0.0.2, which a 127.0.0.1 bind does not take)."""
    port = free_port()
    env = {
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_BATCHER_METRICS_PORT": str(port),
        "SWITCHYARD_BATCHER_METRICS_HOST": "0.0.0.0",
    }
    batcher = role_process("batcher", env)
    batcher.start(ready=http_ready(f"http://127.0.0.2:{port}/metrics", expect=200), timeout=30)
    try:
        assert "switchyard_batcher" in httpx.get(f"http://127.0.0.2:{port}/metrics").text
    finally:
        batcher.stop()


def test_the_publisher_probe_passes_once_the_fleet_picture_is_published(
    tmp_path: Path, valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    env = {"SWITCHYARD_VALKEY_URL": valkey_url, "SWITCHYARD_RUN_DIR": str(tmp_path)}
    assert probe("fleet-publisher", env).returncode == 1

    publisher = role_process("fleet-publisher", env)
    publisher.start()
    try:
        assert wait_until(lambda: probe("fleet-publisher", env).returncode == 0, timeout=30)
    finally:
        publisher.stop()

"""One image, many processes: ``python -m ops.role <role>`` becomes that role's process.

The container image (deploy/docker/Dockerfile) runs every Switchyard process; its command
names the role. The commands are the ones the embedded stack starts (ops/stack.py builds
its children from the same table), so a process runs the same way on a laptop and in a
cluster. ``python -m ops.role probe <role>`` is the exec probe of the roles that serve no
HTTP (deploy/k8s): it asks the role's own evidence of life, not merely whether a PID exists.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Final

from ops.processes import (
    PYTHON,
    REPO_ROOT,
    batcher_command,
    gateway_command,
    s3_endpoint_command,
)
from runtime.env import env_int, env_str

# Every long-running process of a deployment, as ops/stack.py starts them (its simulators,
# Valkey and SeaweedFS stand in for what a cluster takes by URL).
SERVICE_ROLES: Final = (
    "web",
    "gateway",
    "fleet-watcher",
    "fleet-publisher",
    "guardrails",
    "batcher",
    "s3-endpoint",
    "celery-worker",
    "celery-beat",
)
# One-shot roles: run to completion (the migrate Job).
TASK_ROLES: Final = ("migrate",)
ROLES: Final = SERVICE_ROLES + TASK_ROLES
PROBED_ROLES: Final = ("fleet-watcher", "fleet-publisher", "celery-worker", "celery-beat")

DEFAULT_PORTS: Final = {"web": 8000, "gateway": 8080, "s3-endpoint": 9000, "guardrails": 8095}


def role_command(
    role: str,
    *,
    host: str,
    port: int | None = None,
    run_dir: Path | None = None,
    celery_concurrency: int = 2,
) -> list[str]:
    """The argv that runs ``role``; ``port`` defaults to the role's usual one."""
    port = port if port is not None else DEFAULT_PORTS.get(role, 0)
    match role:
        case "web":
            return [
                PYTHON, "-m", "uvicorn", "config.asgi:application", "--host", host,
                "--port", str(port), "--lifespan", "off",
            ]  # fmt: skip
        case "gateway":
            return gateway_command(host, port)
        case "s3-endpoint":
            return s3_endpoint_command(host, port)
        case "fleet-watcher":
            return [PYTHON, "-m", "gateway.fleet_watcher"]
        case "fleet-publisher":
            return [PYTHON, "-m", "portal.fleet.publisher"]
        case "guardrails":
            # It binds SWITCHYARD_GUARDRAIL_HOST / _PORT itself (guardrails/service.py).
            return [PYTHON, "-m", "guardrails.service"]
        case "batcher":
            return batcher_command()
        case "celery-worker":
            return [
                PYTHON, "-m", "celery", "-A", "config.celery", "worker", "--loglevel", "INFO",
                "--concurrency", str(celery_concurrency), "--hostname", "worker@%h",
            ]  # fmt: skip
        case "celery-beat":
            return [
                PYTHON, "-m", "celery", "-A", "config.celery", "beat", "--loglevel", "INFO",
                "--schedule", str(beat_schedule(run_dir)),
            ]  # fmt: skip
        case "migrate":
            # Migrations, then the buckets (a no-op where they exist): what `make up` does
            # before it starts anything that reads the database or object storage.
            return [
                "sh", "-c",
                f"{PYTHON} manage.py migrate --noinput && {PYTHON} manage.py ensure_buckets",
            ]  # fmt: skip
    raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")


def beat_schedule(run_dir: Path | None = None) -> Path:
    run_dir = run_dir or Path(env_str("SWITCHYARD_RUN_DIR", str(REPO_ROOT / ".run")))
    return run_dir / "celerybeat-schedule"


def command_from_env(role: str) -> list[str]:
    """The container's command: bind every interface; ports from the usual variables."""
    host = env_str("SWITCHYARD_BIND_HOST", "0.0.0.0")
    ports = {
        "web": env_int("SWITCHYARD_WEB_PORT", DEFAULT_PORTS["web"], minimum=1),
        "gateway": env_int("SWITCHYARD_GATEWAY_PORT", DEFAULT_PORTS["gateway"], minimum=1),
        "s3-endpoint": env_int(
            "SWITCHYARD_S3_ENDPOINT_PORT", DEFAULT_PORTS["s3-endpoint"], minimum=1
        ),
    }
    return role_command(
        role,
        host=host,
        port=ports.get(role),
        celery_concurrency=env_int("SWITCHYARD_CELERY_CONCURRENCY", 2, minimum=1),
    )


# --- exec probes ---------------------------------------------------------------------------
BEAT_STALE_S: Final = 600.0  # beat saves its schedule at least every 3 minutes while it runs


def probe(role: str) -> str | None:
    """None when the role shows it is working, else why not (printed by the probe)."""
    if role == "celery-beat":
        schedule = beat_schedule()
        # The shelve's file name depends on the dbm backend (none, .db, .dat …).
        ages = [time.time() - p.stat().st_mtime for p in schedule.parent.glob(schedule.name + "*")]
        if not ages:
            return f"no beat schedule at {schedule}"
        if min(ages) > BEAT_STALE_S:
            return f"beat schedule not saved for {min(ages):.0f}s"
        return None
    if role == "celery-worker":
        from config.celery import app

        name = f"worker@{socket.gethostname()}"
        replies = app.control.ping(destination=[name], timeout=5.0)
        return None if replies else f"{name} did not answer a ping"
    from runtime.valkey_urls import DEFAULT_VALKEY_URL, sync_client

    client = sync_client(  # one server, Sentinel or Cluster (docs/valkey-ha.md)
        env_str("SWITCHYARD_VALKEY_URL", DEFAULT_VALKEY_URL),
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
    )
    if role == "fleet-watcher":
        from gateway.fleet_watcher import HEARTBEAT_KEY

        # Written with a TTL by every cycle that reached Valkey (gateway/fleet_watcher.py).
        return None if client.exists(HEARTBEAT_KEY) else "no fleet watcher heartbeat"
    if role == "fleet-publisher":
        from portal.fleet.messages import LAST_SNAPSHOT_KEY

        # Kept with a TTL by the leading publisher every tick.
        return None if client.exists(LAST_SNAPSHOT_KEY) else "no fleet snapshot published"
    raise ValueError(f"no exec probe for {role!r}; one of {', '.join(PROBED_ROLES)}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = f"usage: python -m ops.role [probe] ROLE  (ROLE: {', '.join(ROLES)})"
    if len(args) == 2 and args[0] == "probe" and args[1] in PROBED_ROLES:
        try:
            problem = probe(args[1])
        except Exception as exc:  # a probe says why it failed, it does not trace back
            problem = f"{exc.__class__.__name__}: {exc}"
        if problem:
            print(f"{args[1]}: {problem}", file=sys.stderr)
            return 1
        return 0
    if len(args) != 1 or args[0] not in ROLES:
        print(usage, file=sys.stderr)
        return 2
    argv_ = command_from_env(args[0])
    os.chdir(REPO_ROOT)
    # Replaced, not wrapped: the role's own process receives the pod's SIGTERM.
    os.execvp(argv_[0], argv_)  # noqa: S606 - the role is a fixed argv, no shell


if __name__ == "__main__":
    sys.exit(main())

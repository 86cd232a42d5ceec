"""The embedded stack (`python -m ops.stack`) on ports of its own, for the tests that start
it: a block of free ports, the environment that points it at them, and a listener probe."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from pathlib import Path

from ops.processes import port_bindable
from ops.seaweed import SeaweedPorts
from ops.stack import DEMO_FLEET


def port_is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def stack_env(tmp_path: Path, ports: dict[str, int]) -> dict[str, str]:
    return {
        **os.environ,
        "SWITCHYARD_RUN_DIR": str(tmp_path / "run"),
        "SWITCHYARD_WEB_PORT": str(ports["web"]),
        "SWITCHYARD_GATEWAY_PORT": str(ports["gateway"]),
        "SWITCHYARD_VALKEY_PORT": str(ports["valkey"]),
        "SWITCHYARD_FLEET_BASE_PORT": str(ports["fleet"]),
        "SWITCHYARD_GUARDRAIL_PORT": str(ports["guardrails"]),
        "SWITCHYARD_S3_PORT": str(ports["s3"]),
        "SWITCHYARD_S3_ENDPOINT_PORT": str(ports["s3_endpoint"]),
        "SWITCHYARD_SIM_TIME_SCALE": "0.05",
        "PYTHONUNBUFFERED": "1",
    }


# Below Linux's ephemeral range (32768–60999): a port picked there is never also the local
# port of some test's outgoing connection, which a port picked by binding port 0 can be by the
# time the stack binds it (the stack then refuses to start: "port … is already in use").
_QUIET_PORTS = (10_000, 22_000)  # SeaweedFS's gRPC twins (+10000) stay below 32768 too


def free_block(ports_of: Callable[[int], list[int]], taken: set[int]) -> int:
    """A base port whose ports (``ports_of(base)``) are all bindable now and not ``taken``."""
    chooser = random.Random()
    for _ in range(500):
        base = chooser.randrange(*_QUIET_PORTS)
        block = ports_of(base)
        if not taken & set(block) and all(port_bindable("127.0.0.1", port) for port in block):
            taken.update(block)
            return base
    raise RuntimeError("no free block of ports found below the ephemeral range")


def stack_ports() -> dict[str, int]:
    """Every port the stack takes, none shared: the fleet's in a row, SeaweedFS's ten."""
    taken: set[int] = set()
    chosen = {
        name: free_block(lambda base: [base], taken)
        for name in ("web", "gateway", "valkey", "guardrails", "s3_endpoint")
    }
    replicas = sum(model.replicas for model in DEMO_FLEET)
    chosen["fleet"] = free_block(lambda base: list(range(base, base + replicas)), taken)
    chosen["s3"] = free_block(lambda base: SeaweedPorts.from_base(base).all(), taken)
    return chosen

"""Process helpers for tests live in config.processes (the embedded stack uses them too)."""

from config.processes import (
    PYTHON,
    REPO_ROOT,
    ManagedProcess,
    free_port,
    http_ready,
    port_open,
    wait_until,
)

__all__ = [
    "PYTHON",
    "REPO_ROOT",
    "ManagedProcess",
    "free_port",
    "http_ready",
    "port_open",
    "wait_until",
]

"""The stack's port check: TIME-WAIT leftovers of a previous run are no obstacle, a real
listener is, and the error names the process that holds the port."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ops.processes import free_port, port_bindable, wait_until
from ops.stack import StackConfig, StackError, check_ports


def _config(valkey_port: int, tmp_path: Path) -> StackConfig:
    # The fleet takes four ports from its base: all four free (other test processes run
    # servers on ports of their own meanwhile).
    base = free_port()
    while not all(port_bindable("127.0.0.1", base + n) for n in range(4)):
        base = free_port()
    return StackConfig(
        host="127.0.0.1",
        web_port=free_port(),
        gateway_port=free_port(),
        guardrail_port=free_port(),
        valkey_port=valkey_port,
        fleet_base_port=base,
        run_dir=tmp_path,
        sim_time_scale=1.0,
    )


def _time_wait_on(port: int) -> bool:
    """Whether the kernel holds a TIME-WAIT socket whose local port is ``port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "06":
                return True
    return False


def test_a_port_left_in_time_wait_by_the_previous_run_passes_the_check(tmp_path) -> None:
    with socket.socket() as listener:
        # As uvicorn and valkey bind theirs.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.listen()
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its side of the connection enters TIME-WAIT
        assert client.recv(1) == b""
        client.close()
    assert wait_until(lambda: _time_wait_on(port), timeout=5)

    check_ports(_config(port, tmp_path))  # no StackError: nothing listens there


def test_a_port_held_by_a_listener_names_the_process(tmp_path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            " print(s.getsockname()[1], flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        with pytest.raises(StackError) as caught:
            check_ports(_config(port, tmp_path))
    finally:
        holder.kill()
        holder.wait(10)
    message = str(caught.value)
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert "SWITCHYARD_VALKEY_PORT" in message
    assert f"pid {holder.pid}" in message
    assert "python" in message

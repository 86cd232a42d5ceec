"""Start and stop real server processes: ports, readiness probes, reliable shutdown.

Used by the embedded stack (``make up``) and by the tests. Every process runs in its own
session (process group) so that stopping it also stops its children (uvicorn workers, Celery
pool processes), and its output goes to a log file whose tail is shown when it fails. Every
process also dies with the one that started it, even one killed hard (``die_with_parent``),
and a ``Reaper`` kills the groups a supervisor leaves behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# prctl(2) is Linux's; loaded here, before any fork, so that the child only calls it.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process exits, however
    it exits (SIGKILL and the OOM killer included): a child in a session of its own is reached
    by no signal of its parent's terminal or group.

    None off Linux, and off the main thread: the kernel sends the signal when the *thread*
    that forked the child exits, so a child started from a short-lived thread would die with
    that thread (the main thread lasts as long as the process)."""
    if _LIBC is None or threading.current_thread() is not threading.main_thread():
        return None
    libc = _LIBC
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was asked for
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def gateway_command(host: str, port: int) -> list[str]:
    """How every gateway process is started (the stack, the tests, the benchmarks, the
    standalone command): uvicorn on uvloop and httptools, without its access log (the gateway
    logs its own lines, with the request id) and without its proxy-headers middleware (the
    gateway never reads the client's address, and the middleware scans every request's
    headers for it)."""
    return [
        PYTHON, "-m", "uvicorn", "gateway.asgi:app", "--host", host, "--port", str(port),
        "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--no-proxy-headers",
    ]  # fmt: skip


def s3_endpoint_command(host: str, port: int) -> list[str]:
    """How the S3 endpoint (s3endpoint/) is started, like the gateway: uvicorn on uvloop and
    httptools, its lifespan on (the pooled upstream client and Valkey open there)."""
    return [
        PYTHON, "-m", "uvicorn", "s3endpoint.asgi:app", "--host", host, "--port", str(port),
        "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--no-proxy-headers",
        "--lifespan", "on",
    ]  # fmt: skip


def batcher_command() -> list[str]:
    """How every batcher process is started (the stack, the tests, the benchmarks): it runs
    on uvloop itself (scheduler/batcher/__main__.py)."""
    return [PYTHON, "-m", "scheduler.batcher"]


def batcher_ready(process: ManagedProcess) -> Callable[[], bool]:
    """A batcher is ready once it has joined the groups of every stream it found."""
    return lambda: "batcher_started" in process.log_text()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_bindable(host: str, port: int) -> bool:
    """Whether a server could bind the port now. Binds as uvicorn and valkey do, with
    SO_REUSEADDR, so that a previous run's TIME-WAIT connections do not count as "in use"
    (on Linux a live listener still refuses the bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_listeners(port: int) -> list[str]:
    """Who listens on a TCP port, as "pid N (command line)", for an error worth acting on.
    Sockets of other users' processes show no pid without privileges; those read "a process
    of another user"."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return []
    holders: list[str] = []
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid is None:
            holders.append("a process of another user")
            continue
        try:
            command = (
                " ".join(psutil.Process(conn.pid).cmdline()) or psutil.Process(conn.pid).name()
            )
        except psutil.Error:
            command = "exited"
        holders.append(f"pid {conn.pid} ({command[:120]})")
    return sorted(set(holders))


def http_ready(url: str, *, expect: int | None = None) -> Callable[[], bool]:
    """A readiness probe: the URL answers ``expect``, or any status below 500 if not given."""

    def accepted(status: int) -> bool:
        return status == expect if expect is not None else status < 500

    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback)
                return accepted(int(response.status))
        except urllib.error.HTTPError as exc:
            return accepted(exc.code)
        except OSError:
            return False

    return probe


def port_open(port: int, host: str = "127.0.0.1") -> Callable[[], bool]:
    def probe() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((host, port)) == 0

    return probe


class ManagedProcess:
    """One child process with a log file, a readiness probe and a reliable stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
        log_path: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        if log_path is None:
            fd, log_name = tempfile.mkstemp(prefix=f"switchyard-{name}-", suffix=".log")
            os.close(fd)
            log_path = Path(log_name)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[], bool] | None = None, timeout: float = 30.0) -> None:
        self.launch()
        if ready is not None:
            self.wait_ready(ready, timeout)

    def launch(self) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        log.close()

    def wait_ready(self, ready: Callable[[], bool], timeout: float = 30.0) -> None:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if ready():
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.name} was not ready within {timeout}s:\n" + self.log_tail())

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send a signal to the whole process group (e.g. SIGKILL to simulate a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the group, then SIGKILL whatever is left; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(5)
        # Children that ignored the group signal must not outlive the test either.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class Reaper:
    """The supervisor's side of ``python -m ops.reaper``: the processes it names there are
    killed once it is gone, whichever way it went (see ops/reaper.py)."""

    def __init__(self) -> None:
        # A session of its own: the terminal's Ctrl-C and hang-up reach the supervisor only.
        # Unbuffered: a line must be in the pipe before a SIGKILL can come.
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "ops.reaper"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )

    def watch_group(self, pgid: int) -> None:
        """A process group leader (a ManagedProcess), killed with all of its group."""
        self._say(f"group {pgid}")

    def watch_process(self, pid: int) -> None:
        """A lone process, e.g. a server a library started in the supervisor's own group."""
        self._say(f"process {pid}")

    def forget(self, pid: int) -> None:
        """Stopped by the supervisor itself: its number may soon be another process's."""
        self._say(f"forget {pid}")

    def close(self) -> None:
        """After a clean stop: the reaper finds nothing left to kill, and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _say(self, line: str) -> None:
        # A reaper that is gone must not take the supervisor with it.
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(f"{line}\n".encode())


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05
) -> bool:
    """Poll until the predicate holds; returns whether it did within the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def fleet_is_written(client: Any) -> Callable[[], bool]:
    """A readiness probe for a fleet watcher: every replica of the published policy snapshot
    has an entry in its model's fleet hash. ``client`` is a sync ``valkey.Valkey``."""
    from gateway.policy import SNAPSHOT_KEY, parse_snapshot
    from gateway.scheduling import keys

    def probe() -> bool:
        raw = client.get(SNAPSHOT_KEY)
        if raw is None:
            return False
        policy = parse_snapshot(raw)
        return all(
            client.hexists(keys.fleet(model.public_id), replica)
            for model in policy.models.values()
            for replica in model.replicas
        )

    return probe

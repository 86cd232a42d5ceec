"""Children die with their supervisor (issue 24, defect 16): a stack killed hard (kill -9, the
OOM killer, a closed terminal) left every child running in its own session, holding every
port, so the next `make up` could not start."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from ops.processes import PYTHON, REPO_ROOT, wait_until
from ops.seaweed import SeaweedPorts
from ops.stack import DEMO_FLEET
from testkit.stack_ports import port_is_listening, stack_env, stack_ports

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _gone(process: psutil.Process) -> bool:
    """Exited; a zombie no one has reaped yet holds no port and runs nothing."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _describe(processes: list[psutil.Process]) -> list[str]:
    described = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            described.append(f"{process.pid} {' '.join(process.cmdline())[:100]}")
    return described


def _supervisor(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    """A Python process that starts ManagedProcess children as ``body`` says, prints READY,
    then waits to be killed."""
    script = tmp_path / "supervisor.py"
    script.write_text(
        "import os, sys, threading, time\n"
        "from ops.processes import ManagedProcess\n"
        + textwrap.dedent(body)
        + "print('READY', flush=True)\nsys.stdin.read()\n"
    )
    return subprocess.Popen(
        [PYTHON, str(script)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _children_of(supervisor: subprocess.Popen[str]) -> list[psutil.Process]:
    assert supervisor.stdout is not None
    assert supervisor.stdout.readline().strip() == "READY"
    return psutil.Process(supervisor.pid).children(recursive=True)


def test_a_managed_process_dies_with_its_supervisor(tmp_path: Path) -> None:
    supervisor = _supervisor(
        tmp_path,
        f"""
        child = ManagedProcess("sleeper", {_SLEEPER!r})
        child.launch()
        """,
    )
    try:
        (child,) = _children_of(supervisor)
        supervisor.kill()
        supervisor.wait(10)
        assert wait_until(lambda: _gone(child), timeout=30), _describe([child])
    finally:
        supervisor.kill()
        with contextlib.suppress(psutil.Error):
            child.kill()


def test_a_child_started_from_a_thread_that_ends_keeps_running(tmp_path: Path) -> None:
    """The kernel's parent-death signal follows the thread that forked the child: a child
    started from a short-lived thread must not die with that thread."""
    supervisor = _supervisor(
        tmp_path,
        f"""
        children = []
        def start():
            child = ManagedProcess("sleeper", {_SLEEPER!r})
            child.launch()
            children.append(child)
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        # Gone from the kernel too: a parent-death signal is sent as the thread exits.
        while len(os.listdir("/proc/self/task")) > 1:
            time.sleep(0.01)
        """,
    )
    try:
        (child,) = _children_of(supervisor)
        # A signal sent is delivered within moments: watch the child for a while.
        assert not wait_until(lambda: _gone(child), timeout=2)
    finally:
        supervisor.kill()
        with contextlib.suppress(psutil.Error):
            child.kill()


def test_the_reaper_kills_the_groups_and_processes_a_dead_supervisor_named(
    tmp_path: Path,
) -> None:
    """A parent-death signal reaches only a direct child: a grandchild in its group, and a
    server a library started in the supervisor's own group, go by the reaper."""
    supervisor = _supervisor(
        tmp_path,
        """
        import subprocess, psutil
        from ops.processes import Reaper, wait_until
        reaper = Reaper()
        child = ManagedProcess("parent", ["sh", "-c", "sleep 600 & wait"])
        child.launch()
        reaper.watch_group(child.pid)
        lone = subprocess.Popen(["sleep", "600"])
        reaper.watch_process(lone.pid)
        assert wait_until(lambda: psutil.Process(child.pid).children(), timeout=30)
        """,
    )
    descendants: list[psutil.Process] = []
    try:
        descendants = _children_of(supervisor)
        # The reaper, the child and its grandchild, the lone process.
        assert len(descendants) == 4, _describe(descendants)
        supervisor.kill()
        supervisor.wait(10)
        assert wait_until(lambda: all(_gone(p) for p in descendants), timeout=30), _describe(
            [p for p in descendants if not _gone(p)]
        )
    finally:
        supervisor.kill()
        for process in descendants:
            with contextlib.suppress(psutil.Error):
                process.kill()


@pytest.fixture
def ports() -> dict[str, int]:
    return stack_ports()


@pytest.mark.timeout(480)  # the whole stack starting on a loaded two-core machine
def test_every_process_of_a_stack_killed_hard_exits_and_frees_its_port(
    tmp_path: Path, ports: dict[str, int]
) -> None:
    """SIGKILL gives the supervisor no chance to stop anything: its children, and theirs
    (Celery's pool, the guardrail workers), must go by themselves."""
    output_path = tmp_path / "stack.out"
    with output_path.open("w") as log:
        stack = subprocess.Popen(
            [PYTHON, "-m", "ops.stack"],
            cwd=REPO_ROOT,
            env=stack_env(tmp_path, ports),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    descendants: list[psutil.Process] = []
    try:
        assert wait_until(
            lambda: "Press Ctrl-C" in output_path.read_text() or stack.poll() is not None,
            timeout=300,
        )
        assert stack.poll() is None, output_path.read_text()
        descendants = psutil.Process(stack.pid).children(recursive=True)
        # The stack's tree has grandchildren, which no parent-death signal of its own reaches.
        assert any(p.ppid() != stack.pid for p in descendants), _describe(descendants)

        stack.kill()
        stack.wait(10)

        assert wait_until(lambda: all(_gone(p) for p in descendants), timeout=60), _describe(
            [p for p in descendants if not _gone(p)]
        )
        every_port = [
            *ports.values(),
            *range(ports["fleet"], ports["fleet"] + sum(m.replicas for m in DEMO_FLEET)),
            *SeaweedPorts.from_base(ports["s3"]).all(),
        ]
        assert wait_until(
            lambda: not any(port_is_listening(port) for port in every_port), timeout=10
        ), [port for port in every_port if port_is_listening(port)]
    finally:
        if stack.poll() is None:
            stack.kill()
        for process in descendants:
            with contextlib.suppress(psutil.Error):
                process.kill()

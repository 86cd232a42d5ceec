"""Several "hosts" on one machine, for tests: network namespaces joined by a bridge.

Each host is a namespace with one interface (``eth0``, 10.77.<k>.<n>/24) whose veth peer sits
on a bridge inside a namespace of its own (the "switch"); the root namespace joins the same
bridge as 10.77.<k>.254, so the test itself can reach every host (readiness probes,
publishing a policy) without being one. Each network claims its own subnet <k> (a lock file
per subnet, taken over from a dead owner): test processes running at once (pytest-xdist)
each build theirs, and two root links on one subnet would route one network's traffic into
the other. ``Host.process(...)`` runs a command inside a host
(``ip netns exec``); ``Host.partition(...)`` drops its traffic with iptables in its own
namespace, ``Host.heal()`` undoes it; ``skewed(...)`` runs a process with a shifted wall
clock (libfaketime).

Why iptables and not ``tc netem loss 100%``: this machine's kernel has no ``sch_netem``
(nor ``sch_prio``) module, and iptables in a namespace needs nothing but the package.

Cleanup: ``Network.close()`` (the fixture's finaliser) deletes every namespace and the
root's veth; namespaces are named after the creating process id (``syha<pid>-…``), so a
later run removes those of a run that crashed (its pid gone) before it starts.

Without the capability (not root, no ``ip``/``iptables``, no netns support) the fixture
fails with a message naming what is missing: these tests are never skipped silently.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ops.processes import ManagedProcess

SUBNETS = "10.77"  # each Network claims one /24 of this /16: 10.77.<k>.0/24
_CLAIMS = Path("/tmp/switchyard-netns-subnets")
_PREFIX = "syha"
_OWNED = re.compile(rf"^{_PREFIX}(\d+)-")


class NetnsUnavailable(RuntimeError):
    """This machine cannot host the namespaces (the message names the missing piece)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsUnavailable(
            f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()[-300:]}"
        )
    return result


def require_capabilities() -> None:
    """Raise ``NetnsUnavailable`` naming the first missing capability."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)")
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"`{tool}` is not installed (Debian package {package})")
    probe = f"{_PREFIX}{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-L", "OUTPUT")
    except NetnsUnavailable as exc:
        raise NetnsUnavailable(f"cannot create a network namespace here: {exc}") from exc
    finally:
        _run("ip", "netns", "delete", probe, check=False)


def remove_stale() -> list[str]:
    """Delete the namespaces (and root veths) of runs whose process is gone."""
    removed = []
    names = _run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in names:
        name = line.split(" ")[0]
        owner = _OWNED.match(name)
        if owner and not _alive(int(owner.group(1))):
            _run("ip", "netns", "delete", name, check=False)
            removed.append(name)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for match in re.finditer(rf"^\d+: ({_PREFIX}(\d+)r)[@:]", links, re.M):
        if not _alive(int(match.group(2))):
            _run("ip", "link", "delete", match.group(1), check=False)
            removed.append(match.group(1))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Host:
    """One namespace: an address, processes run in it, and a way to cut it off."""

    def __init__(self, network: Network, name: str, index: int) -> None:
        self.network = network
        self.name = name
        self.namespace = f"{network.prefix}-{name}"
        self.address = f"{network.subnet}.{index}"
        self.processes: list[ManagedProcess] = []
        self._rules: list[list[str]] = []

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]

    def process(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> ManagedProcess:
        """A ``ManagedProcess`` running ``argv`` in this host (not started yet); stopped by
        ``Network.close()`` if the test does not stop it."""
        log_path = (log_dir / f"{self.name}-{name}.log") if log_dir else None
        process = ManagedProcess(
            f"{self.name}-{name}", self.exec_argv(argv), env=env, log_path=log_path
        )
        self.processes.append(process)
        return process

    def run(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run a short command in this host and wait for it."""
        return subprocess.run(
            self.exec_argv(argv), capture_output=True, text=True, check=False, **kwargs
        )  # type: ignore[call-overload]

    def partition(self, *peers: Host) -> None:
        """Drop every packet between this host and ``peers`` (all hosts if none given), in
        both directions: connections stall, as on a real partition (no reset, no refusal)."""
        targets = [peer.address for peer in peers] or [f"{self.network.subnet}.0/24"]
        for target in targets:
            for chain, flag in (("OUTPUT", "-d"), ("INPUT", "-s")):
                rule = [chain, flag, target, "-j", "DROP"]
                _run("ip", "netns", "exec", self.namespace, "iptables", "-I", *rule)
                self._rules.append(rule)

    def heal(self) -> None:
        """Undo ``partition``."""
        while self._rules:
            rule = self._rules.pop()
            _run("ip", "netns", "exec", self.namespace, "iptables", "-D", *rule, check=False)


def skewed(argv: Sequence[str], offset_s: float) -> list[str]:
    """``argv`` run with its wall clock ``offset_s`` seconds off (libfaketime's ``faketime``;
    the monotonic clock is left alone, as NTP would leave it)."""
    if shutil.which("faketime") is None:
        raise NetnsUnavailable("`faketime` is not installed (Debian package faketime)")
    sign = "+" if offset_s >= 0 else "-"
    return ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-f", f"{sign}{abs(offset_s)}s",
            *argv]  # fmt: skip


class Network:
    """``Network(["valkey", "gateway", ...])``: one host per name, 10.77.<k>.1, .2, …"""

    def __init__(self, names: Sequence[str]) -> None:
        require_capabilities()
        remove_stale()
        self.subnet, self._claim = _claim_subnet()
        self.root_address = f"{self.subnet}.254"
        self.prefix = f"{_PREFIX}{os.getpid()}"
        self.switch = f"{self.prefix}-switch"
        self.root_link = f"{self.prefix}r"
        self.hosts: dict[str, Host] = {}
        try:
            self._build(names)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _build(self, names: Sequence[str]) -> None:
        sw = ("ip", "netns", "exec", self.switch)
        _run("ip", "netns", "add", self.switch)
        _run(*sw, "ip", "link", "add", "br0", "type", "bridge")
        _run(*sw, "ip", "link", "set", "br0", "up")
        for index, name in enumerate(names, start=1):
            host = Host(self, name, index)
            self.hosts[name] = host
            ns = ("ip", "netns", "exec", host.namespace)
            _run("ip", "netns", "add", host.namespace)
            _run(*sw, "ip", "link", "add", f"p{index}", "type", "veth", "peer", "name", "hostend")
            _run(*sw, "ip", "link", "set", "hostend", "netns", host.namespace)
            _run(*sw, "ip", "link", "set", f"p{index}", "master", "br0", "up")
            _run(*ns, "ip", "link", "set", "hostend", "name", "eth0")
            _run(*ns, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
            _run(*ns, "ip", "link", "set", "eth0", "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
        # The root namespace (the test) on the same bridge.
        _run(*sw, "ip", "link", "add", "root", "type", "veth", "peer", "name", self.root_link)
        _run(*sw, "ip", "link", "set", self.root_link, "netns", str(os.getpid()))
        _run(*sw, "ip", "link", "set", "root", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.root_address}/24", "dev", self.root_link)
        _run("ip", "link", "set", self.root_link, "up")

    def close(self) -> None:
        """Stop every process started in a host, then delete the namespaces and the veth."""
        for host in self.hosts.values():
            for process in reversed(host.processes):
                with contextlib.suppress(Exception):
                    process.stop()
        _run("ip", "link", "delete", self.root_link, check=False)
        for host in self.hosts.values():
            _run("ip", "netns", "delete", host.namespace, check=False)
        _run("ip", "netns", "delete", self.switch, check=False)
        self._claim.unlink(missing_ok=True)


def _claim_subnet() -> tuple[str, Path]:
    """A /24 no live process holds: its claim file made exclusively (O_EXCL), or taken over
    from an owner that is gone."""
    _CLAIMS.mkdir(parents=True, exist_ok=True)
    for k in range(1, 255):
        claim = _CLAIMS / str(k)
        with contextlib.suppress(FileNotFoundError, ValueError):
            if not _alive(int(claim.read_text() or "0")):
                claim.unlink(missing_ok=True)
        try:
            descriptor = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(descriptor, "w") as owner:
            owner.write(str(os.getpid()))
        return f"{SUBNETS}.{k}", claim
    raise NetnsUnavailable(f"every subnet of {SUBNETS}.0.0/16 is claimed ({_CLAIMS})")

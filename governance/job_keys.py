"""The keys file jobs call the gateway with: one per SLA class, derived, never stored.

File jobs run through the gateway's own admission and priority queue — never around it — as
their use case, at their SLA class's priority class, counted against the use case's limits.
A job key is ``sk-sy-job-`` + HMAC-SHA256(``JOB_KEY_SECRET``, "<use case id>:<SLA class id>"),
so the workers (which hold the secret) compute it and the policy snapshot carries only its
SHA-256, like every other key's. Rotating ``SWITCHYARD_JOB_KEY_SECRET`` rotates all of them at
the next snapshot publish. Their principals have no key id (usage and records show the use
case and an empty key); their prefix in the snapshot is ``job:<SLA class name>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from django.conf import settings

PREFIX = "sk-sy-job-"
# The SLA class id of a use case's default job key: for registrations with an explicit
# deadline and no SLA class. Its snapshot entry runs at the lowest-ranked priority class (the
# batch class), so such work only soaks up idle capacity. Database ids start at 1.
DEFAULT_JOB_KEY_CLASS = 0


def job_key(use_case_id: int, sla_class_id: int, *, secret: str | None = None) -> str:
    """The bearer token a job of this use case and SLA class calls the gateway with."""
    material = (secret if secret is not None else settings.JOB_KEY_SECRET).encode()
    digest = hmac.new(material, f"{use_case_id}:{sla_class_id}".encode(), hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def job_key_for(use_case_id: int, sla_class_id: int | None) -> str:
    """The key of a registration: its SLA class's, or its use case's default one."""
    return job_key(use_case_id, DEFAULT_JOB_KEY_CLASS if sla_class_id is None else sla_class_id)


def job_key_hash(use_case_id: int, sla_class_id: int) -> str:
    """What the snapshot stores: the SHA-256 the gateway looks a bearer token up by."""
    return hashlib.sha256(job_key(use_case_id, sla_class_id).encode()).hexdigest()


def job_key_prefix(sla_class_name: str) -> str:
    return f"job:{sla_class_name}"[:16]


# --- the portal's playground --------------------------------------------------------------
# The portal's playground calls the gateway as the use case, with its limits, guardrails and
# priority, but the web process never holds a developer's key (shown once, stored hashed). It
# derives a playground key the same way as a job key, from a label no SLA class id can spell,
# so the snapshot carries only its hash and the gateway counts and records it as the use case.
# Each key is short-lived: it names a period (an hour), and the snapshot carries the keys of
# the current period and the next, each expiring at its period's end (plus a minute's grace
# for a call that started just before). The snapshot is republished every 30 seconds (beat),
# well within a period, so the portal's key for "now" is always there, and a playground key
# seen anywhere stops working within two hours.
PLAYGROUND_PREFIX = "sk-sy-play-"
PLAYGROUND_KEY_PREFIX = "playground"
PLAYGROUND_KEY_PERIOD_SECONDS = 3600
PLAYGROUND_KEY_GRACE_SECONDS = 60


def playground_period(at: float) -> int:
    """The period a moment (a Unix time) falls in."""
    return int(at // PLAYGROUND_KEY_PERIOD_SECONDS)


def playground_key_expiry(period: int) -> float:
    """When a period's key stops working at the gateway (a Unix time)."""
    return float((period + 1) * PLAYGROUND_KEY_PERIOD_SECONDS + PLAYGROUND_KEY_GRACE_SECONDS)


def playground_key(use_case_id: int, period: int, *, secret: str | None = None) -> str:
    """The bearer token the portal's playground calls the gateway with, for this use case,
    in this period."""
    material = (secret if secret is not None else settings.JOB_KEY_SECRET).encode()
    label = f"playground:{use_case_id}:{period}".encode()
    digest = hmac.new(material, label, hashlib.sha256).digest()
    return PLAYGROUND_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def playground_key_hash(use_case_id: int, period: int) -> str:
    return hashlib.sha256(playground_key(use_case_id, period).encode()).hexdigest()

"""Every periodic task, in one place."""

from __future__ import annotations

from config.env import env_float

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Safety net: a snapshot lost with a Valkey restart, or a publish deferred while Valkey
    # was down, reaches the gateway within this interval.
    "republish-policy-snapshot": {
        "task": "governance.publish_policy_snapshot",
        "schedule": env_float("SWITCHYARD_SNAPSHOT_REPUBLISH_SECONDS", 30.0, minimum=1.0),
    },
}

"""Every periodic task, in one place."""

from __future__ import annotations

from runtime.env import env_float

_USAGE_PERSIST_SECONDS = env_float("SWITCHYARD_USAGE_PERSIST_SECONDS", 5.0, minimum=0.5)
_RECORDS_PERSIST_SECONDS = env_float("SWITCHYARD_RECORDS_PERSIST_SECONDS", 5.0, minimum=0.5)
_RETENTION_SECONDS = 3600.0
_FILE_UPLOADS_POLL_SECONDS = env_float("SWITCHYARD_FILE_UPLOADS_POLL_SECONDS", 2.0, minimum=0.1)
_FILE_JOBS_DISPATCH_SECONDS = env_float("SWITCHYARD_FILE_JOBS_DISPATCH_SECONDS", 2.0, minimum=0.1)
_MULTIPART_EXPIRY_SECONDS = 3600.0

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    # Safety net: a snapshot lost with a Valkey restart, or a publish deferred while Valkey
    # was down, reaches the gateway within this interval.
    "republish-policy-snapshot": {
        "task": "governance.publish_policy_snapshot",
        "schedule": env_float("SWITCHYARD_SNAPSHOT_REPUBLISH_SECONDS", 30.0, minimum=1.0),
    },
    # The audit chain's head, HMAC-signed into a checkpoint outside the database, so that a
    # chain rewritten in the database no longer verifies (see governance/anchors.py).
    "anchor-audit-chain": {
        "task": "governance.anchor_audit_chain",
        "schedule": env_float("SWITCHYARD_AUDIT_ANCHOR_SECONDS", 300.0, minimum=1.0),
        "options": {"expires": 60.0},
    },
    # Deprecated models past their sunset marked retired, audited as the system. The gateway
    # does not wait for it: it compares the sunset with its own clock.
    "retire-sunset-models": {
        "task": "governance.retire_sunset_models",
        "schedule": env_float("SWITCHYARD_MODEL_RETIRE_SECONDS", 60.0, minimum=1.0),
        "options": {"expires": 60.0},
    },
    # The gateway's usage and admission streams into the database; a run that could not
    # start within one interval is superseded by the next rather than piling up.
    "persist-usage": {
        "task": "scheduler.persist_usage",
        "schedule": _USAGE_PERSIST_SECONDS,
        "options": {"expires": _USAGE_PERSIST_SECONDS},
    },
    # The gateway's transcripts (sy:records) into sealed objects; content must not linger
    # in Valkey, and a run that could not start in time is superseded by the next.
    "persist-records": {
        "task": "scheduler.persist_records",
        "schedule": _RECORDS_PERSIST_SECONDS,
        "options": {"expires": _RECORDS_PERSIST_SECONDS},
    },
    # Usage roll-ups and admission decisions past SWITCHYARD_USAGE_RETENTION_DAYS /
    # SWITCHYARD_DECISION_RETENTION_DAYS; each run deletes a bounded number of batches.
    "apply-retention": {
        "task": "scheduler.apply_retention",
        "schedule": _RETENTION_SECONDS,
        "options": {"expires": _RETENTION_SECONDS},
    },
    # Interaction records and their objects past each use case's retention, unless on legal
    # hold; bounded batches per run, each audited.
    "apply-record-retention": {
        "task": "scheduler.apply_record_retention",
        "schedule": _RETENTION_SECONDS,
        "options": {"expires": _RETENTION_SECONDS},
    },
    # File registrations never uploaded by their deadline or promise; bounded batches per
    # run, each audited, so a backlog drains over several runs.
    "expire-file-registrations": {
        "task": "governance.expire_file_registrations",
        "schedule": env_float("SWITCHYARD_FILE_EXPIRY_SECONDS", 60.0, minimum=1.0),
        "options": {"expires": 60.0},
    },
    # Upload events (sy:uploads) matched to their registrations and queued; a beat task rather
    # than a long poll: no process of its own, and a dead worker's entries are claimed.
    "consume-uploads": {
        "task": "scheduler.consume_uploads",
        "schedule": _FILE_UPLOADS_POLL_SECONDS,
        "options": {"expires": _FILE_UPLOADS_POLL_SECONDS},
    },
    # Multipart uploads left unfinished past SWITCHYARD_S3_MULTIPART_MAX_AGE_SECONDS: aborted in
    # the files bucket (their parts are stored and nothing reads them) and their registrations
    # freed for a new upload.
    "expire-multipart-uploads": {
        "task": "scheduler.expire_multipart_uploads",
        "schedule": _MULTIPART_EXPIRY_SECONDS,
        "options": {"expires": _MULTIPART_EXPIRY_SECONDS},
    },
    # Queued file jobs handed to workers: in their windows, earliest deadline first, bounded.
    "dispatch-file-jobs": {
        "task": "scheduler.dispatch_file_jobs",
        "schedule": _FILE_JOBS_DISPATCH_SECONDS,
        "options": {"expires": _FILE_JOBS_DISPATCH_SECONDS},
    },
}

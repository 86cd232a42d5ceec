"""What auditors and finance read: usage roll-ups, admission decisions, guardrail findings and
sealed interaction records, persisted exactly once from the gateway's and the batcher's Valkey
streams, kept for their retention, and read through ``records.reading`` and ``records.api``.

Above governance (records are scoped by its tenants, use cases and legal holds), below the
deferred work that writes some of them (docs/architecture.md, "Floors").
"""

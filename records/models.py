"""What auditors and finance read: usage roll-ups, admission decisions, guardrail findings and
interaction records, persisted from the gateway's Valkey streams.

The tables were created by the ``scheduler`` app's migrations 0001–0007 and keep their names
(``db_table``): ``records/migrations/0001`` adopts them without touching the database.

Rows carry the use case's id, the tenant's id and its slug as the gateway saw them, not
foreign keys: usage history must outlive a use case being deleted, and the persister must never
refuse a batch because governance changed meanwhile.
"""

from __future__ import annotations

from django.db import models


class UsageMinute(models.Model):
    """One use case's traffic to one model in one minute (UTC), summed from ``sy:usage``."""

    use_case_id = models.BigIntegerField()
    tenant = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    minute = models.DateTimeField(help_text="Start of the minute, UTC.")
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0, help_text="Requests answered with status ≥ 400.")
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    queued_ms = models.BigIntegerField(default=0, help_text="Sum of time spent queued.")
    total_ms = models.BigIntegerField(default=0, help_text="Sum of time in the gateway.")

    class Meta:
        db_table = "scheduler_usageminute"  # created by the scheduler app's migrations
        constraints = [
            models.UniqueConstraint(
                fields=["use_case_id", "tenant", "model", "minute"], name="usage_minute_key"
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "minute"], name="usage_minute_tenant"),
            models.Index(fields=["minute"], name="usage_minute_minute"),
        ]
        ordering = ["-minute", "tenant", "model"]

    def __str__(self) -> str:
        return f"{self.tenant}/{self.use_case_id} {self.model} @ {self.minute:%Y-%m-%d %H:%M}"


class AdmissionDecision(models.Model):
    """A refusal or a queue wait: what an auditor reads to answer "why was this refused".

    Refusals are also summarised, per use case × model × decision × reason × minute, in the
    hash-chained audit trail (``audit_sequence`` names the event); these rows are the
    per-request detail and are deleted after ``DECISION_RETENTION_DAYS``, the summaries never.
    """

    class Kind(models.TextChoices):
        ADMITTED = "admitted"
        QUEUED = "queued"
        REJECTED = "rejected"
        SHED = "shed"
        # Refused by its model for capacity and handed to the use case's fallback (issue 27):
        # the entry names the model that refused; the reason, why and which fallback.
        FALLBACK = "fallback"

    stream_id = models.CharField(
        max_length=40, unique=True, help_text="The sy:decisions entry it came from."
    )
    request_id = models.CharField(max_length=128, db_index=True)
    record_id = models.CharField(
        max_length=40, blank=True, db_index=True, help_text="The interaction record's id."
    )
    occurred_at = models.DateTimeField(db_index=True)
    decision = models.CharField(max_length=16, choices=Kind.choices)
    reason = models.CharField(max_length=200, blank=True, help_text="The limit or cause.")
    tenant = models.CharField(max_length=100, help_text="The slug as the gateway saw it.")
    # The key for scoping: a slug can be renamed and reused; the use case's tenant cannot
    # change, so the persister takes the tenant's id from the use case.
    tenant_id = models.BigIntegerField(null=True, blank=True)
    use_case_id = models.BigIntegerField()
    key_id = models.BigIntegerField(null=True, blank=True)
    model = models.CharField(max_length=200)
    retry_after_s = models.PositiveIntegerField(
        default=0, help_text="The Retry-After the refusal answered, in seconds (0: none)."
    )
    queued_ms = models.BigIntegerField(default=0)
    policy_version = models.BigIntegerField(null=True, blank=True)
    audit_sequence = models.BigIntegerField(
        null=True,
        blank=True,
        help_text=(
            "The audit event summarising this refusal (rejected or shed); set once, in the "
            "transaction that stores the row, so a refusal is summarised exactly once."
        ),
    )

    class Meta:
        db_table = "scheduler_admissiondecision"  # created by the scheduler app's migrations
        indexes = [
            models.Index(fields=["tenant", "occurred_at"], name="decision_tenant_time"),
            models.Index(fields=["tenant_id", "occurred_at"], name="decision_tenant_id_time"),
        ]
        ordering = ["-occurred_at"]

    def __str__(self) -> str:
        return f"{self.decision} {self.request_id} ({self.reason})"


class StreamCursor(models.Model):
    """The last stream entry whose effects are committed, per stream.

    Updated in the same transaction as the roll-ups, so an entry delivered again (a worker
    that died between COMMIT and XACK) is recognised by its id and not counted twice.
    Its row lock also serialises persisters, which is what makes the cursor sound.
    """

    stream = models.CharField(max_length=100, primary_key=True)
    last_id = models.CharField(max_length=40, default="0-0")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "scheduler_streamcursor"  # created by the scheduler app's migrations

    def __str__(self) -> str:
        return f"{self.stream} @ {self.last_id}"


class GuardrailFinding(models.Model):
    """One guardrail that found something (or could not run) in one stage of one request.

    Persisted from ``sy:guardrails``: what an officer or auditor reads to answer "what did the
    PII guardrail redact for this use case yesterday". Entity types and counts only, never
    the text that matched.
    """

    class Action(models.TextChoices):
        BLOCKED = "blocked"
        REDACTED = "redacted"
        FLAGGED = "flagged"
        FAILED_OPEN = "failed_open", "failed open"
        FAILED_CLOSED = "failed_closed", "failed closed"

    class Stage(models.TextChoices):
        REQUEST = "request"
        RESPONSE = "response"

    stream_id = models.CharField(
        max_length=40, unique=True, help_text="The sy:guardrails entry it came from."
    )
    request_id = models.CharField(max_length=128, db_index=True)
    record_id = models.CharField(
        max_length=40, blank=True, db_index=True, help_text="The interaction record's id."
    )
    occurred_at = models.DateTimeField(db_index=True)
    tenant = models.CharField(max_length=100, help_text="The slug as the gateway saw it.")
    # Scoping key, from the use case (its tenant never changes), as for admission decisions.
    tenant_id = models.BigIntegerField(null=True, blank=True)
    use_case_id = models.BigIntegerField()
    key_id = models.BigIntegerField(null=True, blank=True)
    model = models.CharField(max_length=200)
    stage = models.CharField(max_length=8, choices=Stage.choices)
    guardrail = models.CharField(max_length=64)
    action = models.CharField(max_length=16, choices=Action.choices)
    entities = models.JSONField(default=dict, help_text="Entity type → count; never the text.")
    score = models.FloatField(null=True, blank=True)
    policy_version = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "scheduler_guardrailfinding"  # created by the scheduler app's migrations
        indexes = [
            models.Index(fields=["tenant_id", "occurred_at"], name="finding_tenant_id_time"),
            models.Index(fields=["use_case_id", "occurred_at"], name="finding_use_case_time"),
            models.Index(fields=["guardrail", "occurred_at"], name="finding_guardrail_time"),
        ]
        ordering = ["-occurred_at", "-id"]

    def __str__(self) -> str:
        return f"{self.guardrail} {self.action} on {self.stage} of {self.request_id}"


class GuardrailHour(models.Model):
    """Findings of one guardrail, one action, one use case in one hour (UTC): the roll-up
    that counts and charts read, kept longer than the per-request rows."""

    use_case_id = models.BigIntegerField()
    tenant_id = models.BigIntegerField(null=True, blank=True)
    tenant = models.CharField(max_length=100)
    guardrail = models.CharField(max_length=64)
    action = models.CharField(max_length=16, choices=GuardrailFinding.Action.choices)
    hour = models.DateTimeField(help_text="Start of the hour, UTC.")
    findings = models.BigIntegerField(default=0)

    class Meta:
        db_table = "scheduler_guardrailhour"  # created by the scheduler app's migrations
        constraints = [
            models.UniqueConstraint(
                fields=["use_case_id", "guardrail", "action", "hour"], name="guardrail_hour_key"
            )
        ]
        indexes = [models.Index(fields=["hour"], name="guardrail_hour_hour")]
        ordering = ["-hour", "guardrail", "action"]

    def __str__(self) -> str:
        return f"{self.use_case_id} {self.guardrail} {self.action} @ {self.hour:%Y-%m-%d %H}h"


class RecordObject(models.Model):
    """One sealed, compressed JSON Lines object of transcripts: one use case, one hour (UTC),
    one persister batch. Its checksums are written to the audit trail when it is stored, so
    a changed or swapped object fails verification (records/objects.py)."""

    key = models.CharField(max_length=512, unique=True, help_text="The object's name.")
    use_case_id = models.BigIntegerField()
    tenant_id = models.BigIntegerField(null=True, blank=True)
    hour = models.DateTimeField(help_text="Start of the hour (UTC) its records finished in.")
    records = models.PositiveIntegerField()
    size = models.BigIntegerField(help_text="Bytes stored (sealed).")
    sha256 = models.CharField(max_length=64, help_text="Of the plaintext JSON Lines.")
    sealed_sha256 = models.CharField(max_length=64, help_text="Of the bytes stored.")
    key_id = models.CharField(max_length=64, help_text="The key-encryption key that sealed it.")
    created_at = models.DateTimeField(auto_now_add=True)
    audit_sequence = models.BigIntegerField(
        null=True, blank=True, help_text="The audit event that recorded its checksums."
    )

    class Meta:
        db_table = "scheduler_recordobject"  # created by the scheduler app's migrations
        indexes = [models.Index(fields=["use_case_id", "hour"], name="record_object_use_case")]
        ordering = ["-hour", "key"]

    def __str__(self) -> str:
        return self.key


# An interaction record's metadata columns: what a usage entry owns (and what an export
# lists before the content). The content columns (content, object, line, content_sha256,
# truncated) belong to the records persister and are never among them.
RECORD_METADATA_FIELDS = (
    "request_id",
    "occurred_at",
    "tenant",
    "tenant_id",
    "use_case_id",
    "key_id",
    "model",
    "endpoint",
    "replica",
    "status",
    "streamed",
    "prompt_tokens",
    "completion_tokens",
    "queued_ms",
    "upstream_ms",
    "total_ms",
    "policy_version",
    "record_policy",
)


class InteractionRecord(models.Model):
    """One request through the gateway, as its use case's record policy kept it: the
    metadata always (from ``sy:usage``), the content for ``full`` (from ``sy:records``, in a
    ``RecordObject``). Identified by the gateway's own ``record_id``: a client's request id
    may repeat."""

    class Content(models.TextChoices):
        NONE = "none", "not kept (metadata policy)"
        PENDING = "pending", "not received yet"
        STORED = "stored", "stored"
        DROPPED = "dropped", "dropped by the gateway (buffer full)"

    record_id = models.CharField(max_length=40, unique=True)
    request_id = models.CharField(max_length=128, db_index=True)
    occurred_at = models.DateTimeField(help_text="When the request finished.")
    tenant = models.CharField(max_length=100, help_text="The slug as the gateway saw it.")
    tenant_id = models.BigIntegerField(null=True, blank=True)
    use_case_id = models.BigIntegerField()
    key_id = models.BigIntegerField(null=True, blank=True)
    model = models.CharField(max_length=200)
    endpoint = models.CharField(max_length=64, blank=True)
    replica = models.CharField(max_length=300, blank=True)
    status = models.PositiveSmallIntegerField()
    streamed = models.BooleanField(default=False)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    queued_ms = models.BigIntegerField(default=0)
    upstream_ms = models.BigIntegerField(default=0)
    total_ms = models.BigIntegerField(default=0)
    policy_version = models.BigIntegerField(null=True, blank=True)
    record_policy = models.CharField(max_length=8, help_text="metadata or full, as applied.")
    content = models.CharField(max_length=8, choices=Content.choices, default=Content.NONE)
    object = models.ForeignKey(
        RecordObject, null=True, blank=True, on_delete=models.SET_NULL, related_name="lines"
    )
    line = models.PositiveIntegerField(null=True, blank=True, help_text="Index in the object.")
    content_sha256 = models.CharField(max_length=64, blank=True, help_text="Of its line.")
    truncated = models.BooleanField(
        default=False, help_text="The request or response was longer than the capture limit."
    )

    class Meta:
        db_table = "scheduler_interactionrecord"  # created by the scheduler app's migrations
        indexes = [
            models.Index(fields=["occurred_at"], name="record_time"),
            models.Index(fields=["tenant_id", "occurred_at"], name="record_tenant_time"),
            models.Index(fields=["use_case_id", "occurred_at"], name="record_use_case_time"),
            models.Index(fields=["key_id", "occurred_at"], name="record_key_time"),
            models.Index(fields=["model", "occurred_at"], name="record_model_time"),
            models.Index(fields=["status", "occurred_at"], name="record_status_time"),
        ]
        ordering = ["-occurred_at", "-id"]

    def __str__(self) -> str:
        return f"{self.record_id} ({self.request_id})"

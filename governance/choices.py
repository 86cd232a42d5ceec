from django.db import models


class Environment(models.TextChoices):
    """The tenant's environment: the first axis of the priority matrix."""

    DEV = "dev", "Development"
    TEST = "test", "Test"
    UAT = "uat", "UAT"
    PROD = "prod", "Production"


class Namespace(models.TextChoices):
    """The caller's deployment namespace: the second axis of the priority matrix."""

    PROD_DR = "prod-dr", "prod-DR"
    PROD = "prod", "prod"
    DEMO = "demo", "demo"
    UAT = "uat", "UAT"
    QA = "qa", "QA"
    DEV = "dev", "dev"


class UseCaseKind(models.TextChoices):
    CHATBOT = "chatbot", "Chatbot"
    AGENT = "agent", "Agent"
    RAG = "rag", "RAG"
    EXTRACTION = "extraction", "Extraction"
    BATCH = "batch", "Batch"
    EMBEDDINGS = "embeddings", "Embeddings"
    TRANSCRIPTION = "transcription", "Transcription"


class UseCaseStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    SUBMITTED = "submitted", "Submitted"
    APPROVED = "approved", "Approved"
    SUSPENDED = "suspended", "Suspended"
    RETIRED = "retired", "Retired"


class DataClassification(models.TextChoices):
    PUBLIC = "public", "Public"
    INTERNAL = "internal", "Internal"
    CONFIDENTIAL = "confidential", "Confidential"
    RESTRICTED = "restricted", "Restricted"


class Capability(models.TextChoices):
    CHAT = "chat", "Chat completions"
    COMPLETIONS = "completions", "Completions"
    EMBEDDINGS = "embeddings", "Embeddings"
    TRANSCRIPTION = "transcription", "Audio transcription"
    # A guard model (Llama Guard's prompt format) that fleet-run guardrails ask for verdicts.
    GUARD = "guard", "Guard model (guardrail verdicts)"


class ModelStatus(models.TextChoices):
    """A model's lifecycle: served, served with notices until its sunset, then no longer."""

    ACTIVE = "active", "Active"
    DEPRECATED = "deprecated", "Deprecated"
    RETIRED = "retired", "Retired"


class AtSunset(models.TextChoices):
    """What the gateway does with a deprecated model's requests once its sunset has passed."""

    REFUSE = "refuse", "Refuse (410 naming the successor)"
    SUCCESSOR = "successor", "The successor serves under the old id"


class GuardrailSide(models.TextChoices):
    REQUEST = "request", "Request"
    RESPONSE = "response", "Response"
    BOTH = "both", "Request and response"


class GuardrailAction(models.TextChoices):
    BLOCK = "block", "Block"
    REDACT = "redact", "Redact"
    FLAG = "flag", "Flag (audit only)"


class GuardrailFailure(models.TextChoices):
    """What the gateway does when a selected guardrail cannot run (workers down, timeout)."""

    CLOSED = "closed", "Fail closed (refuse with 503)"
    OPEN = "open", "Fail open (let through, record it)"


class RateLimitScope(models.TextChoices):
    GLOBAL = "global", "Global"
    MODEL = "model", "Model"
    TENANT = "tenant", "Tenant"
    TENANT_MODEL = "tenant_model", "Tenant × model"


class ApiKeyStatus(models.TextChoices):
    PENDING = "pending", "Pending approval"
    APPROVED = "approved", "Approved, not yet revealed"
    ACTIVE = "active", "Active"
    REJECTED = "rejected", "Rejected"
    REVOKED = "revoked", "Revoked"


class RecordPolicy(models.TextChoices):
    """What the gateway keeps of a use case's requests (docs/records.md)."""

    NONE = "none", "None: no interaction record"
    METADATA = "metadata", "Metadata: who, when, model, tokens, status, latency, findings"
    FULL = "full", "Full: metadata plus the request and the response, after redaction"


class FileKind(models.TextChoices):
    """What a registered file is, which decides its pipeline (docs/files.md)."""

    AUDIO = "audio", "Audio (transcription)"
    PDF = "pdf", "PDF document"
    TEXT = "text", "Text document"
    BATCH = "batch", "JSON Lines batch (OpenAI Batch format)"


class FileState(models.TextChoices):
    """A file registration's life: registered → uploaded → queued → running → one end."""

    REGISTERED = "registered", "Registered (awaiting upload)"
    UPLOADED = "uploaded", "Uploaded"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


# An SLA class's settings, in the order every door shows them (service, API, admin, policy
# files), and the shortest turnaround it may promise.
SLA_CLASS_FIELDS = (
    "name",
    "description",
    "turnaround_seconds",
    "windows",
    "time_zone",
    "priority_class",
    "max_file_bytes",
    "kinds",
)
SLA_MIN_TURNAROUND_SECONDS = 60

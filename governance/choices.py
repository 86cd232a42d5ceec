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


class GuardrailSide(models.TextChoices):
    REQUEST = "request", "Request"
    RESPONSE = "response", "Response"


class GuardrailAction(models.TextChoices):
    BLOCK = "block", "Block"
    REDACT = "redact", "Redact"
    FLAG = "flag", "Flag (audit only)"


class Guardrail(models.TextChoices):
    """The guardrails the gateway can apply; a use case selects among them."""

    PII = "pii", "Personal data (PII)"
    SECRETS = "secrets", "Secrets and credentials"
    PROMPT_INJECTION = "prompt_injection", "Prompt injection"
    TOXICITY = "toxicity", "Toxicity / profanity"
    BANNED_TOPICS = "banned_topics", "Banned topics (e.g. financial advice)"
    INVISIBLE_TEXT = "invisible_text", "Invisible / control characters"


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

from django.db import models


class Environment(models.TextChoices):
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


class Capability(models.TextChoices):
    CHAT = "chat", "Chat completions"
    COMPLETIONS = "completions", "Completions"
    EMBEDDINGS = "embeddings", "Embeddings"
    TRANSCRIPTION = "transcription", "Audio transcription"


class ApiKeyStatus(models.TextChoices):
    PENDING = "pending", "Pending approval"
    ACTIVE = "active", "Active"
    REJECTED = "rejected", "Rejected"
    REVOKED = "revoked", "Revoked"

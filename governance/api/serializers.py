"""Shapes of the governance API. Validation of values beyond field types happens in the
models' ``clean()`` via the services, so every door gives the same message."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from governance import model_routing
from governance.choices import Capability
from governance.models import (
    ApiKey,
    AuditEvent,
    Deployment,
    GuardrailSelection,
    Model,
    ModelPrice,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    Tenant,
    UseCase,
    model_id_validator,
)
from governance.prices import currency
from governance.services.record_bounds import RETENTION_DAYS_MAX

User = get_user_model()

# Bounds of the database's integer columns, the same on every backend (SQLite would take 64-bit
# values that PostgreSQL refuses), so the schema and the server agree on what fits.
INT32_MAX = 2**31 - 1
SMALLINT_MAX = 2**15 - 1
LIMIT = {"min_value": 1, "max_value": INT32_MAX}  # a per-minute or per-day limit, if set
# A string list item: non-empty, and short enough for any sane use.
ITEM_MAX = 2048
# Base URLs of vLLM replicas, as the model's clean() requires them.
REPLICA_URL = r"^https?://\S+$"


class UniqueListField(serializers.ListField):
    """A JSON list whose items may not repeat; the schema says so with ``uniqueItems``."""

    default_error_messages = {"not_unique": "Remove the duplicates."}

    def to_internal_value(self, data: Any) -> list[Any]:
        values: list[Any] = super().to_internal_value(data)
        if len({repr(value) for value in values}) != len(values):
            self.fail("not_unique")
        return values


def _strings(**kwargs: Any) -> UniqueListField:
    """A list of distinct non-empty strings (the JSON lists of the governance records)."""
    return UniqueListField(
        child=serializers.CharField(max_length=ITEM_MAX, trim_whitespace=False), **kwargs
    )


class ReferenceSerializer(serializers.Serializer[Any]):
    """One record that still refers to the one a request tried to delete."""

    type = serializers.CharField(help_text="e.g. use case, priority rule")
    id = serializers.CharField(help_text="its primary key")
    repr = serializers.CharField(help_text="how it reads, e.g. acme/chatbot")


class ErrorSerializer(serializers.Serializer[Any]):
    """The body of every error but a 400: what went wrong, in words; a code for some."""

    detail = serializers.CharField()
    code = serializers.CharField(required=False, help_text="e.g. protected")
    referenced_by = ReferenceSerializer(
        many=True, required=False, help_text="With code protected: the records still in the way"
    )


class TenantSerializer(serializers.ModelSerializer[Tenant]):
    members = serializers.SlugRelatedField(
        many=True, slug_field="username", queryset=User.objects.all(), required=False
    )
    contacts = UniqueListField(
        child=serializers.EmailField(max_length=254),
        required=False,
        help_text="Further contact e-mails",
    )

    class Meta:
        model = Tenant
        fields = (
            "id",
            "slug",
            "name",
            "business_unit",
            "application_id",
            "environment",
            "owner_email",
            "contacts",
            "members",
            "legal_hold",
            "created_at",
            "updated_at",
        )
        # A hold moves only with its own action and a reason (POST …/legal-hold/).
        read_only_fields = ("legal_hold", "created_at", "updated_at")


class LegalHoldSerializer(serializers.Serializer[Any]):
    """Place (``hold: true``) or lift (``hold: false``) a legal hold; the reason goes into
    the audit trail either way."""

    hold = serializers.BooleanField(help_text="true: place the hold; false: lift it")
    reason = serializers.CharField(max_length=2000, help_text="Why; recorded in the audit trail")


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    model = serializers.SlugRelatedField(slug_field="public_id", queryset=Model.objects.all())
    replicas = UniqueListField(
        child=serializers.RegexField(REPLICA_URL, max_length=ITEM_MAX),
        min_length=1,
        help_text="Base URLs of the vLLM replicas",
    )
    lora_adapters = _strings(
        required=False, help_text="LoRA adapter names served on this base model"
    )
    version = serializers.RegexField(
        model_routing.LABEL,
        max_length=32,
        required=False,
        allow_blank=True,
        error_messages={"invalid": f"Use {model_routing.LABEL_HELP}."},
        help_text="The model version it serves, e.g. v2 (docs/models.md); empty: no versions. "
        "All of a model's active deployments name one, or none does.",
    )

    class Meta:
        model = Deployment
        fields = (
            "id",
            "model",
            "served_name",
            "replicas",
            "node_pool",
            "version",
            "lora_adapters",
            "max_in_flight_per_replica",
            "active",
            "created_at",
            "updated_at",
        )
        read_only_fields = ("created_at", "updated_at")
        extra_kwargs = {"max_in_flight_per_replica": LIMIT}


class DeploymentSummarySerializer(serializers.ModelSerializer[Deployment]):
    """A deployment as every role may see it in the catalogue: where a model runs is not
    shown (replica URLs are the fleet's internal addresses; officers read /api/deployments/)."""

    class Meta:
        model = Deployment
        fields = ("id", "served_name", "version", "lora_adapters", "active")
        read_only_fields = fields


class ModelPriceSerializer(serializers.ModelSerializer[ModelPrice]):
    """One price of a model's history; it applies from ``effective_from`` until the next one.
    Set through policy as code (docs/policy-as-code.md "Prices"); amounts are exact decimals."""

    currency = serializers.SerializerMethodField(help_text="ISO 4217, e.g. EUR")

    class Meta:
        model = ModelPrice
        fields = ("effective_from", "input_per_mtok", "output_per_mtok", "currency")
        read_only_fields = fields

    def get_currency(self, price: ModelPrice) -> str:
        return currency()


class ModelPriceInputSerializer(serializers.Serializer[Any]):
    """A new price for a model's history (officers); governance/prices.py checks it against
    the history: a price may start in the past only before the model's first price."""

    effective_from = serializers.CharField(
        max_length=64,
        help_text="ISO 8601 date and time with a time zone, e.g. 2026-07-01T00:00:00Z",
    )
    input_per_mtok = serializers.DecimalField(
        max_digits=18,
        decimal_places=6,
        min_value=Decimal(0),
        help_text="Price of a million prompt tokens, in the company's currency",
    )
    output_per_mtok = serializers.DecimalField(
        max_digits=18,
        decimal_places=6,
        min_value=Decimal(0),
        help_text="Price of a million completion tokens, in the company's currency",
    )


class ModelSerializer(serializers.ModelSerializer[Model]):
    deployments = DeploymentSummarySerializer(many=True, read_only=True)
    prices = ModelPriceSerializer(
        many=True, read_only=True, help_text="Price history per million tokens, oldest first"
    )
    capabilities = UniqueListField(
        child=serializers.ChoiceField(Capability.choices),
        min_length=1,
        help_text="What clients may call it for",
    )
    successor = serializers.SlugRelatedField(
        slug_field="public_id",
        queryset=Model.objects.all(),
        allow_null=True,
        required=False,
        help_text="The public id of the model callers should move to (needed to deprecate)",
    )
    routing = serializers.DictField(
        required=False,
        help_text='Which version answers (docs/models.md): {"split": {"v1": 95, "v2": 5}, '
        '"sticky": "request" or "use_case", "aliases": {"stable": "v1"}}; the versions are '
        "its active deployments' labels. {} with no versions, or to let the first answer.",
    )

    class Meta:
        model = Model
        fields = (
            "id",
            "public_id",
            "description",
            "capabilities",
            "timeout_seconds",
            "max_tokens",
            "status",
            "deprecated_at",
            "sunset_at",
            "successor",
            "notice_url",
            "at_sunset",
            "routing",
            "deployments",
            "prices",
            "created_at",
            "updated_at",
        )
        # ``deprecated_at`` is stamped by the service on the write that deprecates.
        read_only_fields = ("deprecated_at", "created_at", "updated_at")
        extra_kwargs = {
            "timeout_seconds": {"min_value": 0.1, "max_value": 86400.0},
            "max_tokens": LIMIT,
        }


class GuardrailSelectionSerializer(serializers.ModelSerializer[GuardrailSelection]):
    """A selection: the catalogue checks ``guardrail``, ``side``, ``action`` and ``config``
    (in the services); ``config`` comes back complete, with the detector's defaults."""

    guardrail = serializers.CharField(
        max_length=64, help_text="A catalogue name (GET /api/guardrails/catalogue/)"
    )
    config = serializers.DictField(required=False, help_text="Guardrail-specific settings")
    position = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=SMALLINT_MAX,
        help_text="Where it runs among the use case's guardrails (0 first); default: last",
    )

    class Meta:
        model = GuardrailSelection
        fields: tuple[str, ...] = (
            "id",
            "use_case",
            "guardrail",
            "side",
            "action",
            "config",
            "position",
        )


class UseCaseGuardrailSerializer(GuardrailSelectionSerializer):
    """A selection under /api/use-cases/{id}/guardrails/: the use case is in the path."""

    class Meta(GuardrailSelectionSerializer.Meta):
        fields = ("id", "guardrail", "side", "action", "config", "position")


class PatchedUseCaseGuardrailSerializer(UseCaseGuardrailSerializer):
    """The schema of a partial change (every field optional)."""

    guardrail = serializers.CharField(max_length=64, required=False)

    class Meta(UseCaseGuardrailSerializer.Meta):
        extra_kwargs = {
            "side": {"required": False},
            "action": {"required": False},
        }


class GuardrailReorderSerializer(serializers.Serializer[Any]):
    order = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        max_length=100,
        help_text="Every selection id of the use case, in the order they are to run",
    )


class CatalogueEntrySerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field, not Field.label
    stages = serializers.ListField(child=serializers.CharField())
    modes = serializers.ListField(child=serializers.CharField())
    runs_on = serializers.CharField(help_text="worker: a CPU detector; fleet: a model it asks")
    description = serializers.CharField()
    model_capability = serializers.CharField(
        allow_null=True, help_text="For fleet-run guardrails: the capability config.model needs"
    )


class UseCaseSerializer(serializers.ModelSerializer[UseCase]):
    tenant = serializers.SlugRelatedField(slug_field="slug", queryset=Tenant.objects.all())
    allowed_models = serializers.SlugRelatedField(
        many=True, slug_field="public_id", queryset=Model.objects.all(), required=False
    )
    guardrails = GuardrailSelectionSerializer(many=True, read_only=True)
    model_pins = serializers.DictField(
        child=serializers.CharField(max_length=32),
        required=False,
        help_text='Model versions this use case always gets: {"<model id>": "<version or '
        "alias>\"}, whatever the model's split (officers)",
    )
    model_fallbacks = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(max_length=128)),
        required=False,
        help_text='Models that serve, in order, when a model refuses for capacity: {"<model '
        'id>": ["<fallback id>", ...]}, 1 to 3 of the use case\'s own models (officers; '
        'docs/models.md, "Fallbacks")',
    )
    status_changed_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = UseCase
        fields = (
            "id",
            "tenant",
            "slug",
            "name",
            "kind",
            "purpose",
            "data_classification",
            "status",
            "status_changed_at",
            "status_changed_by",
            "status_reason",
            "namespace",
            "allowed_models",
            "model_pins",
            "model_fallbacks",
            "requests_per_minute",
            "tokens_per_minute",
            "tokens_per_day",
            "max_concurrent",
            "ticket_ref",
            "service_account_client_id",
            "guardrail_failure",
            "guardrails",
            "record_policy",
            "record_retention_days",
            "records_visible_to_developers",
            "legal_hold",
            "async_result_ttl_seconds",
            "async_cache_seconds",
            "created_at",
            "updated_at",
        )
        read_only_fields = (
            "legal_hold",
            "status",
            "status_changed_at",
            "status_reason",
            "created_at",
            "updated_at",
        )
        extra_kwargs = {
            "purpose": {"max_length": 10_000},
            "requests_per_minute": LIMIT,
            "tokens_per_minute": LIMIT,
            "tokens_per_day": LIMIT,
            "max_concurrent": LIMIT,
            "record_retention_days": {"min_value": 1, "max_value": RETENTION_DAYS_MAX},
            "async_result_ttl_seconds": {"min_value": 10, "max_value": 86_400},
            "async_cache_seconds": {"min_value": 0, "max_value": 86_400},
        }

    def validate_tenant(self, tenant: Tenant) -> Tenant:
        if self.instance is not None and tenant != self.instance.tenant:
            raise serializers.ValidationError("A use case cannot move to another tenant.")
        return tenant

    def validate_model_pins(self, pins: dict[str, str]) -> dict[str, str]:
        """Keys are model ids (the values are checked by the field, the pins by the use case):
        a key no id can be never reaches a query."""
        _model_ids(pins)
        return pins

    def validate_model_fallbacks(self, fallbacks: dict[str, list[str]]) -> dict[str, list[str]]:
        """Keys are model ids, as for the pins (the chains are checked by the use case)."""
        _model_ids(fallbacks)
        return fallbacks


def _model_ids(models: Iterable[str]) -> None:
    for model in models:
        try:
            model_id_validator(model)
        except DjangoValidationError:
            raise serializers.ValidationError(f"{model!r} is not a model id.") from None


class UseCaseTransitionSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class PriorityClassSerializer(serializers.ModelSerializer[PriorityClass]):
    class Meta:
        model = PriorityClass
        fields = (
            "id",
            "name",
            "rank",
            "vllm_priority",
            "queue_timeout_seconds",
            "max_queue_length",
            "max_pool_share",
            "degrade_after_seconds",
        )
        extra_kwargs = {
            "rank": {"min_value": 0, "max_value": SMALLINT_MAX},
            "vllm_priority": {"min_value": -INT32_MAX - 1, "max_value": INT32_MAX},
            "queue_timeout_seconds": {"min_value": 0.0, "max_value": 86400.0},
            "max_queue_length": {"min_value": 0, "max_value": INT32_MAX},
            "max_pool_share": {"min_value": 0.001, "max_value": 1.0},
            "degrade_after_seconds": {"min_value": 0.0, "max_value": 86400.0},
        }


class PriorityRuleSerializer(serializers.ModelSerializer[PriorityRule]):
    priority_class = serializers.SlugRelatedField(
        slug_field="name", queryset=PriorityClass.objects.all()
    )

    class Meta:
        model = PriorityRule
        fields = ("id", "environment", "namespace", "priority_class")


class RateLimitPolicySerializer(serializers.ModelSerializer[RateLimitPolicy]):
    model = serializers.SlugRelatedField(
        slug_field="public_id", queryset=Model.objects.all(), required=False, allow_null=True
    )
    tenant = serializers.SlugRelatedField(
        slug_field="slug", queryset=Tenant.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = RateLimitPolicy
        fields = (
            "id",
            "name",
            "scope",
            "model",
            "tenant",
            "requests_per_minute",
            "tokens_per_minute",
            "tokens_per_day",
        )
        extra_kwargs = {
            "requests_per_minute": LIMIT,
            "tokens_per_minute": LIMIT,
            "tokens_per_day": LIMIT,
        }


class ApiKeySerializer(serializers.ModelSerializer[ApiKey]):
    """A key as anyone may see it: never the secret, never its hash."""

    use_case = serializers.PrimaryKeyRelatedField(queryset=UseCase.objects.all())
    requested_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    decided_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = ApiKey
        fields = (
            "id",
            "use_case",
            "name",
            "reason",
            "status",
            "prefix",
            "requested_by",
            "decided_by",
            "decided_at",
            "decision_reason",
            "revealed_at",
            "expires_at",
            "last_used_at",
            "rotated_from",
            "created_at",
        )
        read_only_fields = (
            "status",
            "prefix",
            "decided_at",
            "decision_reason",
            "revealed_at",
            "last_used_at",
            "rotated_from",
            "created_at",
        )
        extra_kwargs = {"reason": {"required": True, "allow_blank": False, "max_length": 2000}}


class ReasonRequiredSerializer(serializers.Serializer[Any]):
    """The body of a refusal (rejecting, suspending), as the schema states it: the services
    require the reason, which is what the requester or the tenant reads."""

    reason = serializers.CharField(max_length=2000)


class ApiKeyDecisionSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class ApiKeyRotateSerializer(serializers.Serializer[Any]):
    grace_seconds = serializers.IntegerField(required=False, min_value=0, max_value=7 * 86400)


class RevealedKeySerializer(serializers.Serializer[Any]):
    """The one response that carries a secret: the reveal, or a rotation's new key."""

    key = ApiKeySerializer()
    secret = serializers.CharField(help_text="The API key. Shown this once; store it now.")


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    class Meta:
        model = AuditEvent
        fields = (
            "sequence",
            "occurred_at",
            "actor",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "tenant_id",
            "tenant_slug",
            "before",
            "after",
            "request_id",
            "source_ip",
            "prev_hash",
            "hash",
            "hash_version",
        )
        read_only_fields = fields


class ChainReportSerializer(serializers.Serializer[Any]):
    ok = serializers.BooleanField()
    events_checked = serializers.IntegerField()
    first_broken_sequence = serializers.IntegerField(allow_null=True)
    problem = serializers.CharField(allow_blank=True)
    checkpoints_checked = serializers.IntegerField(
        help_text="Signed checkpoints outside the database that the chain matched."
    )


class MeSerializer(serializers.Serializer[Any]):
    username = serializers.CharField()
    roles = serializers.ListField(child=serializers.CharField())
    tenants = serializers.ListField(child=serializers.CharField())
